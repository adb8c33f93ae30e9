"""A request's life, from the POST to its release: ``submission`` (plan, admit, reserve,
send), ``turns`` (whose queued request a worker's message runs: analysts take turns),
``execution`` (a worker claims and runs it), ``outcomes`` (commit or refund, in
groups), ``releaser`` (results released on the clock's tick), ``waiting`` (an analyst
waiting for the final state) and ``recovery`` (the sweep that re-sends or refunds what a
dead worker or broker left).

May import: ``governance.datasets``, ``governance.ledger``, ``governance.core``,
``governance.models``, accounting, engines. Tasks are sent by name through
``governance.core.dispatch``: never ``workers.tasks``.
Must not import: ``governance.audit``, ``governance.web``, ``governance.api``. Imported
by the api, the management commands and workers.
"""
