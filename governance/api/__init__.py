"""The REST API (Django REST framework): datasets, grants, ledger, estimates, analysts."""
