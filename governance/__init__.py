"""The privacy-budget governance service: Django project and app in one package.

Django's entry points stay at the top (``settings``, ``urls``, ``wsgi``, ``apps``,
``models``, ``migrations``, ``management``, ``templates``, ``templatetags``); the code is
in subpackages by business area, each importing only those below it::

    api | web            the REST API; the officer's admin pages and the analyst's page
    requests | audit     a request's life from the POST to its release; verifying and exporting the trail
    datasets             registering, storing and reading tables
    ledger               the budget ledger and the audit trail written with it
    core                 plumbing: environment, errors, security, roles, checks, task dispatch
    models               the Django models (one module)

``accounting`` (pure) and ``engines`` (no Django) sit outside it and never import it.
The direction is checked by import-linter (``.importlinter``, run by
``tests/test_import_contracts.py``), with imports inside functions counted too.
"""
