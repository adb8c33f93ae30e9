"""API tokens: issued, rotated and revoked in one place for the REST API (an officer's
``POST /api/analysts/{id}/token/``) and the web pages (the officer's token page, an
analyst's or auditor's "new token" button). A token lives ``API_TOKEN_TTL_DAYS`` after
issue (``security.ExpiringTokenAuthentication`` refuses it after that)."""

from __future__ import annotations

from datetime import timedelta

from django.conf import settings
from rest_framework.authtoken.models import Token

#: set in a web session opened with an API token (/analyst/login/): such a session never
#: opens the admin, even once its account is made staff (``web.admin_site``)
SESSION_KEY = "opened_with_api_token"


def expires(token):
    """When ``token`` stops working (None: never)."""
    ttl = settings.API_TOKEN_TTL_DAYS
    return token.created + timedelta(days=ttl) if ttl else None


def revoke(user, *, end_sessions: bool = True) -> None:
    """``user``'s token stops working at once; with ``end_sessions`` so do web sessions
    opened with it (/analyst/login/): a new unusable password changes the session hash
    Django checks on every request (an officer's password is kept: officers' sessions come
    from their password, not a token)."""
    Token.objects.filter(user=user).delete()
    if end_sessions and not user.is_staff:
        user.set_unusable_password()
        user.save(update_fields=["password"])


def issue(user, *, end_sessions: bool = True, by=None) -> Token:
    """A new token for ``user``; the old one (if any) stops working. Issued ``by`` another
    account (an officer), the step goes into Django's admin log (the account's history
    page, "Recent actions"): with the token the officer could act as her."""
    revoke(user, end_sessions=end_sessions)
    token = Token.objects.create(user=user)
    if by is not None and by.pk != user.pk:
        from django.contrib.admin.models import CHANGE, LogEntry

        LogEntry.objects.log_actions(by.pk, [user], CHANGE, change_message="Issued a new API token (the old one "
                                                                            "stopped working).", single_object=True)
    return token


def current(user):
    """``user``'s token (None if it has none); never shown again, only its dates."""
    return Token.objects.filter(user=user).first()
