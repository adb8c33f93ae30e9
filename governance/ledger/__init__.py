"""The privacy-budget ledger: every charge, refund and refusal, and the hash-chained
audit trail written with it.

``actions`` holds the ledger's actions (admit, reserve, commit, release), each in one
transaction under the dataset's budget row lock; ``sql`` the same on the database's side;
``group`` group commit; ``limits`` what a request is gated against and how spending is
stated; ``estimates`` and ``refined_reports`` what a request would cost and what was
spent; ``trail`` the audit record written in the same transaction as the ledger change it
records, and its canonical encoding.

May import: accounting, ``governance.core``, ``governance.models``.
Must not import: ``governance.datasets``, ``governance.requests``, ``governance.audit``,
``governance.web``, ``governance.api``, engines or workers. Everything above it imports
it.
"""
