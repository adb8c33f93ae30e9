"""Who a user is to the service: a privacy officer (staff), an auditor, or an analyst."""

from __future__ import annotations

AUDITORS_GROUP = "auditors"


def is_officer(user) -> bool:
    """Privacy officers are staff users."""
    return bool(user and user.is_authenticated and user.is_staff)


def is_auditor(user) -> bool:
    """Auditors: read-only access to audit records and exports, nothing else."""
    if not (user and user.is_authenticated):
        return False
    cached = getattr(user, "_is_auditor", None)
    if cached is None:
        cached = user._is_auditor = user.groups.filter(name=AUDITORS_GROUP).exists()
    return cached


def can_audit(user) -> bool:
    """Privacy officers (staff) and auditors."""
    return bool(user and user.is_authenticated and (user.is_staff or is_auditor(user)))


def role_of(user) -> str:
    if is_officer(user):
        return "privacy_officer"
    return "auditor" if is_auditor(user) else "analyst"
