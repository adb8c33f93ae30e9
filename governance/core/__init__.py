"""The plumbing under every business area: reading the environment (``env``), the
errors with stable codes (``errors``), authentication, throttles and headers
(``security``), who a user is to the service (``roles``), the system checks (``checks``),
raw-row guards (``raw_rows``), sending Celery tasks by name (``dispatch``) and the
workers' liveness records (``liveness``).

May import: Django, accounting, ``governance.models``.
Must not import: any other governance subpackage (datasets, ledger, requests, audit,
web, api) nor ``workers``; everything above may import it.
"""
