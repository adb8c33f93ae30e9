"""The REST API (Django REST framework): datasets, grants, ledger, estimates, requests,
audit, analysts. Views parse and check the input, call one business area's action and
shape the answer; the rules live below.

May import: ``governance.requests``, ``governance.audit``, ``governance.datasets``,
``governance.ledger``, ``governance.core``, ``governance.models``.
Must not import: ``governance.web`` (its sibling). Nothing in governance imports it
except ``governance.urls`` and the settings' strings (parsers, renderers, pagination,
the exception handler).
"""
