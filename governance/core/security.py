"""Security plumbing for the web side: response headers, expiring API tokens, and the
per-analyst rate limit on request creation."""

from __future__ import annotations

import logging
import re

from django.conf import settings
from django.db import OperationalError
from django.utils import timezone
from django.utils.translation import gettext_lazy as _
from rest_framework import exceptions
from rest_framework.authentication import TokenAuthentication
from rest_framework.throttling import UserRateThrottle

from . import tokens

log = logging.getLogger(__name__)

# Every page uses only its own origin; styles are inline <style> blocks and SVG attributes.
# /api/docs/ (Swagger UI) too: its files are static files of ours (drf-spectacular-sidecar)
# and its initializer a script of its own (/api/docs/?script=), not inline.
CSP = ("default-src 'self'; img-src 'self' data:; style-src 'self' 'unsafe-inline'; script-src 'self'; "
       "object-src 'none'; base-uri 'self'; form-action 'self'; frame-ancestors 'none'")
PERMISSIONS_POLICY = "camera=(), microphone=(), geolocation=(), payment=(), usb=()"


class SecurityHeaders:
    """Content-Security-Policy and Permissions-Policy on every response, the API docs
    included (Django's SecurityMiddleware and XFrameOptionsMiddleware add nosniff, Referrer-Policy,
    HSTS when configured, and X-Frame-Options); ``Cache-Control: private, no-store`` on every
    answer to a signed-in caller (a token or a session) that sets none: a result, a token or
    an audit trail kept by a shared browser's or a proxy's cache is another person's to read."""

    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        response = self.get_response(request)
        if "Cache-Control" not in response.headers and (
                "HTTP_AUTHORIZATION" in request.META or getattr(getattr(request, "user", None), "is_authenticated",
                                                                 False)):
            response.headers["Cache-Control"] = "private, no-store"
        response.headers.setdefault("Content-Security-Policy", CSP)
        response.headers.setdefault("Permissions-Policy", PERMISSIONS_POLICY)
        response.headers.setdefault("Cross-Origin-Opener-Policy", "same-origin")
        return response


# Unicode's directional formatting characters: embeddings, overrides and isolates (and the
# marks). In text an analyst sent (a request's params, an alias) shown on an officer's or an
# auditor's page they reorder what follows: '{"epsilon": 0.25}' after U+202E reads "52.0".
# Text in a right-to-left script is shown right to left without them.
BIDI_CONTROLS = "\u061c\u200e\u200f\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069"
_BIDI_SHOWN = {ord(c): f"\\u{ord(c):04x}" for c in BIDI_CONTROLS}


def bidi_shown(text: str) -> str:
    """``text`` with each directional formatting character written as its escape
    (``\\u202e``): visible, and in a JSON string the same value."""
    return text.translate(_BIDI_SHOWN)


# Control characters a terminal acts on: C0 but tab and line feed (ESC starts the sequences
# that clear the screen, set the window title or write the clipboard), DEL, and C1 (U+009B
# is a CSI to terminals that read UTF-8 C1). An officer's reference or an analyst's alias
# holding them reached the officer's terminal raw through ``manage.py audit export``.
_CONTROLS_SHOWN = {c: f"\\u{c:04x}" for c in [*range(0x00, 0x09), *range(0x0b, 0x20), *range(0x7f, 0xa0)]}
_C1 = re.compile("[\x7f-\x9f]")


_ALL_SHOWN = {**_BIDI_SHOWN, **_CONTROLS_SHOWN}


def all_shown(text: str) -> str:
    """``bidi_shown`` and the control characters (``_CONTROLS_SHOWN``) as escapes, in one
    pass (a CSV cell: two passes cost the audit export 0.75 us more per cell)."""
    return text.translate(_ALL_SHOWN)


def json_c1_escaped(text: str) -> str:
    """JSON text with DEL and the C1 controls escaped (``\\u009b``), as json escapes C0
    itself: the same values, nothing a terminal acts on."""
    if text.isascii():  # the usual export: one fast pass (the search alone added 26% to json.dumps)
        return text if "\x7f" not in text else text.replace("\x7f", "\\u007f")
    return _C1.sub(lambda m: f"\\u{ord(m.group()):04x}", text) if _C1.search(text) else text


class NeutralBidi:
    """Every HTML page (the admin, the auditor's and the analyst's pages) with directional
    formatting characters written as their escapes (``bidi_shown``): the page's own text
    has none, so whatever has one came from someone's input."""

    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        response = self.get_response(request)
        if (not response.streaming and response.get("Content-Type", "").startswith("text/html")
                and any(c.encode() in response.content for c in BIDI_CONTROLS)):
            charset = response.charset or "utf-8"
            response.content = bidi_shown(response.content.decode(charset)).encode(charset)
        return response


class BadQuery:
    """A query string the database cannot take is a 400 on every page outside the API (which
    answers it in JSON itself), as the API's parser makes it for a body: a NUL character (PostgreSQL's text refuses it: a DataError, a 500
    on the admin's and the auditor's filters) or an integer past 64 bits where an id goes
    (SQLite's OverflowError on the admin's changelists)."""

    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        if request.path.startswith("/api/"):  # the API answers these itself, in JSON
            return self.get_response(request)
        if any("\x00" in k or any("\x00" in v for v in vs) for k, vs in request.GET.lists()):
            from django.http import HttpResponseBadRequest

            return HttpResponseBadRequest("A query parameter holds a NUL character.", content_type="text/plain")
        return self.get_response(request)

    def process_exception(self, request, exception):
        if isinstance(exception, OverflowError) and request.method in ("GET", "HEAD") \
                and not request.path.startswith("/api/"):
            from django.http import HttpResponseBadRequest

            return HttpResponseBadRequest("A query parameter is a number too large for what it names.",
                                          content_type="text/plain")
        return None


class StorageFull:
    """A full disk (a table's copy, the database) on a web page (the officer's forms, the
    admin) is a 507 saying so, a read-only one a 503, and a database busy, away or broken
    out of a deadlock a 503 with Retry-After, not Django's 500 page (with its traceback
    under DEBUG); the API's own handler says the same in JSON (``storage.full``,
    ``storage.unwritable``, ``database.unavailable``)."""

    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        return self.get_response(request)

    def process_exception(self, request, exception):
        from django.http import HttpResponse
        from django.utils.html import escape

        from .errors import STORAGE_FULL_DETAIL, STORAGE_UNWRITABLE_DETAIL, storage_full, storage_unwritable

        if (why := storage_full(exception)) is not None:
            logging.getLogger(__name__).error("no space left: %s", exception)
            return HttpResponse(f"<!doctype html><title>No space left</title><h1>No space left on the server</h1>"
                                f"<p>{escape(STORAGE_FULL_DETAIL.format(why))}</p>", status=507)
        if (why := storage_unwritable(exception)) is not None:
            logging.getLogger(__name__).error("storage not writable: %s", exception)
            return HttpResponse(f"<!doctype html><title>Storage not writable</title><h1>The server cannot write its "
                                f"storage</h1><p>{escape(STORAGE_UNWRITABLE_DETAIL.format(why))}</p>", status=503)
        if isinstance(exception, OperationalError):
            # the database locked past its timeout, restarting, unreachable, or a deadlock it
            # broke: the page's transaction rolled back (the API's 503 database.unavailable);
            # an admin action answered Django's 500 page (a probe's revoke beside cancels)
            logging.getLogger(__name__).error("database unavailable: %s", exception)
            return HttpResponse("<!doctype html><title>Database busy</title><h1>The database is busy or "
                                "unreachable</h1><p>Nothing was kept. Retry in a few seconds.</p>", status=503,
                                headers={"Retry-After": "5"})
        return None


class ExpiringTokenAuthentication(TokenAuthentication):
    """DRF tokens that expire ``API_TOKEN_TTL_DAYS`` after they were issued (0: never).
    An officer issues a new one with ``POST /api/analysts/{id}/token/`` (the old one stops
    working at once) and revokes one with ``DELETE`` on the same URL."""

    def authenticate_credentials(self, key):
        user, token = _token_and_user(key)
        if token is None:
            raise exceptions.AuthenticationFailed(_("Invalid token."))
        if not user.is_active:
            raise exceptions.AuthenticationFailed(_("User inactive or deleted."))
        ends = tokens.expires(token)
        if ends is not None and ends < timezone.now():
            raise exceptions.AuthenticationFailed(
                f"This token expired ({settings.API_TOKEN_TTL_DAYS} days after it was issued); ask a privacy "
                "officer for a new one.")
        return user, token


def still_signed_in(request) -> bool:
    """Whether the caller of the DRF ``request`` would still be let in now: its token
    (``request.auth``) still issued, unexpired and its user active, or its session still
    valid (the user active, the session's password hash current: revoking or reissuing a
    token ends her sessions). A ``?wait=`` of up to 30 s re-checks it before answering: a
    token revoked while its call waited still received the result (a probe's)."""
    from rest_framework.authtoken.models import Token

    if isinstance(request.auth, Token):
        try:
            ExpiringTokenAuthentication().authenticate_credentials(request.auth.key)
        except exceptions.AuthenticationFailed:
            return False
        return True
    from django.contrib.auth import get_user

    user = get_user(request._request)  # not the request's cached user: read again
    return bool(user.is_authenticated and user.pk == request.user.pk)


def _token_and_user(key: str):
    """(user, token) for the token ``key``, or (None, None): DRF's
    ``Token.objects.select_related("user").get(key=key)`` as one written-out statement (the
    ORM built that query on every API call, ~1 ms). Read on every call, never cached: a
    revoked or reissued token, or a deactivated user, counts at once."""
    from django.contrib.auth import get_user_model
    from django.db import connection
    from rest_framework.authtoken.models import Token

    from .raw_rows import concrete, from_row

    user_model = get_user_model()
    fields = concrete(user_model)
    t, u = Token._meta.db_table, user_model._meta.db_table
    cols = ", ".join(f"u.{connection.ops.quote_name(f.column)}" for f in fields)
    with connection.cursor() as cur:
        cur.execute(f"SELECT t.created, {cols} FROM {t} t JOIN {u} u ON u.{user_model._meta.pk.column} = t.user_id "
                    "WHERE t.key = %s", [key])
        row = cur.fetchone()
    if row is None:
        return None, None
    user = from_row(user_model, fields, row[1:])
    token_fields = [Token._meta.get_field(name) for name in ("key", "user", "created")]
    return user, from_row(Token, token_fields, [key, user.pk, row[0]])


class RequestCreationThrottle(UserRateThrottle):
    """At most ``REQUEST_RATE_LIMIT`` new requests per analyst (e.g. ``120/min``); a 429
    with ``Retry-After`` past it. Counted in the default cache (Redis in production)."""

    scope = "request_creation"

    def get_rate(self):
        from .checks import rate_problem

        rate = settings.REQUEST_RATE_LIMIT or None
        if problem := rate_problem(rate):
            # The system check (governance.E007) refuses it at start-up; should a process run
            # with it anyway, no limit rather than a 500 on every POST /api/requests/.
            log.error("rate limit not applied: %s", problem)
            return None
        return rate

    def allow_request(self, request, view):
        if self.rate is None:
            return True
        try:
            if super().allow_request(request, view):
                return True
            # past the limit: a retry of a POST already admitted (its Idempotency-Key) is no
            # new request, and refusing it left a client whose answer was lost unable to
            # learn whether it was charged (a probe); it gets that request back, uncounted
            return _sent_before(request)
        except Exception:  # noqa: BLE001 - the cache (Redis) is down or restarting
            # Fail open: the limit is against floods, not against overspending (the gate
            # holds the budget whatever the rate), and a 500 would refuse every request.
            log.warning("rate limit not applied: the cache is unavailable", exc_info=True)
            return True


def _sent_before(request) -> bool:
    """Whether the analyst has a request sent with this POST's Idempotency-Key."""
    from ..models import Request

    key = request.headers.get("Idempotency-Key")
    return bool(key) and Request.objects.filter(analyst_id=request.user.pk, idempotency_key=key).exists()
