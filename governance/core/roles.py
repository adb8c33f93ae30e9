"""Who a user is to the service: a privacy officer (staff), an auditor, or an analyst."""

from __future__ import annotations

AUDITORS_GROUP = "auditors"

# Usernames: ASCII only, unique ignoring case. "аnn" (a Cyrillic а) or "Ann" beside "ann"
# would be another person who reads as the same one in the audit trail, which names every
# actor by username. The user model's field (hold_usernames_to_the_rule) and the API's
# analyst form hold to it.
USERNAME_PATTERN = r"\A[A-Za-z0-9_.@+-]{1,150}\Z"
USERNAME_RULE = "1-150 ASCII letters, digits and _ . @ + - (no look-alike letters of other scripts)"
USERNAME_TAKEN = "A user with this username (ignoring case) already exists."


def username_taken(username: str) -> bool:
    from django.contrib.auth import get_user_model

    return get_user_model().objects.filter(username__iexact=username).exists()


def _not_taken(username: str) -> None:
    from django.core.exceptions import ValidationError

    if username_taken(username):
        raise ValidationError(USERNAME_TAKEN, code="username_taken")


def hold_usernames_to_the_rule() -> None:
    """The rule on the user model's username field itself (at start-up), so every way to
    make an account validates it: the admin's add form, ``createsuperuser`` (a probe made a
    Cyrillic "аlice" and an "ALICE" beside "alice" with it). The username is never edited
    after (read-only in the admin, absent from the API), so a new name is all it checks."""
    from django.contrib.auth import get_user_model
    from django.core.validators import RegexValidator

    field = get_user_model()._meta.get_field("username")
    if not any(getattr(v, "regex", None) is not None and v.regex.pattern == USERNAME_PATTERN
               for v in field.validators):
        field.validators.extend([RegexValidator(USERNAME_PATTERN, USERNAME_RULE, code="invalid_username"),
                                 _not_taken])


def is_officer(user) -> bool:
    """Privacy officers are staff users."""
    return bool(user and user.is_authenticated and user.is_staff)


def is_auditor(user) -> bool:
    """Auditors: read-only access to audit records and exports, nothing else."""
    if not (user and user.is_authenticated):
        return False
    cached = getattr(user, "_is_auditor", getattr(user, "auditor_flag", None))  # (``with_auditor_flag``)
    if cached is None:
        cached = user._is_auditor = user.groups.filter(name=AUDITORS_GROUP).exists()
    return cached


def with_auditor_flag(users):
    """A user queryset whose rows carry ``is_auditor`` (one subquery, not one query a row: a
    probe's list of 2,000 accounts ran 4,006 statements)."""
    from django.contrib.auth.models import Group
    from django.db.models import Exists, OuterRef

    return users.annotate(auditor_flag=Exists(Group.objects.filter(user=OuterRef("pk"), name=AUDITORS_GROUP)))


def can_audit(user) -> bool:
    """Privacy officers (staff) and auditors."""
    return bool(user and user.is_authenticated and (user.is_staff or is_auditor(user)))


def role_of(user) -> str:
    if is_officer(user):
        return "privacy_officer"
    return "auditor" if is_auditor(user) else "analyst"
