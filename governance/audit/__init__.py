"""The auditor's side of the trail: ``verification`` re-checks each dataset's hash chain
and its agreement with the ledger, ``export`` builds the signed-off export (JSON, CSV)
and ``pdf`` the human-readable PDF report built from it. The records themselves are
written by the ledger (``governance.ledger.trail``), in the ledger's own transactions.

May import: ``governance.ledger``, ``governance.datasets``, ``governance.core``,
``governance.models``, accounting.
Must not import: ``governance.requests``, ``governance.web``, ``governance.api``.
Imported by the api, the admin pages and the ``audit`` management command.
"""
