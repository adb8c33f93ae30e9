"""The web pages: the Django admin for privacy officers (``admin``, ``admin_forms``,
``admin_site`` with the officer's dashboard, its ``charts``, the estimate tool and the API
token page), the analyst's home page and token sign-in (``analyst_views``), the auditor's
pages (``auditor_views``), and ``paging`` (filtered, paginated lists).

May import: ``governance.audit``, ``governance.requests``, ``governance.datasets``,
``governance.ledger``, ``governance.core``, ``governance.models``.
Must not import: ``governance.api`` (the REST API is its sibling, not its base); nothing
in governance imports it except ``governance.apps`` (admin registration) and
``governance.urls``.
"""
