"""Management commands that replace a library's own of the same name (``drf_create_token``:
tokens issued through ``governance.core.tokens``; ``generateschema``: drf-spectacular's
schema, where DRF's generator failed on the service's views). Django runs the command of
the first app in INSTALLED_APPS that has one, so this app comes before ``rest_framework``;
the project's other commands live in ``governance.management``, whose app comes last.

May import: ``governance.core``.
Must not import: ``governance.requests``, ``governance.web``, ``governance.api``,
``governance.audit``, ``governance.datasets``, ``governance.ledger``.
Imported by Django's command runner only.
"""
