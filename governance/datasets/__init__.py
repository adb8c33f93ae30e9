"""Datasets: registering a table (an upload, a server path or Parquet partitions) and
editing it (``registry``), storing and reading files (``files``, ``data``), the column
schema (``schema``), the budget as stated (``budget``), distributed datasets
(``partitions``), previews, recommendations, the demo tables and what an engine is told
about a dataset (``engine_meta``).

Inside, the order is: registry above partitions and data, above schema and budget, above
files; no module imports one above it.

May import: ``governance.ledger`` (a budget change is checked against what the ledger has
spent), ``governance.core``, ``governance.models``, accounting, engines.
Must not import: ``governance.requests``, ``governance.audit``, ``governance.web``,
``governance.api``. Imported by requests (a request runs on a dataset's columns), audit,
web and api.
"""
