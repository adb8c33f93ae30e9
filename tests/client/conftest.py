"""The client against a live server (pytest-django's ``live_server``: a real HTTP server in a
thread of this process, on the test database).

Requests run where the tests elsewhere run them: Celery eager, so the task runs when the
POST's transaction commits, in the server's thread; ``tests/client/test_real_worker.py``
sends them to a real worker process on Redis instead. The client package is imported from
``client/`` as it is in the repository (a fresh clone needs no install for these tests;
``test_packaging.py`` builds its wheel).
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
from rest_framework.authtoken.models import Token

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT / "client") not in sys.path:
    sys.path.insert(0, str(ROOT / "client"))

from privacy_client import Backoff, Client  # noqa: E402

SCHEMA = {"age": {"lower": 18, "upper": 90, "integer": True}, "income": {"lower": 0, "upper": 200_000},
          "site": {"type": "categorical", "domain": ["north", "south", "east", "west"]}}


@dataclass
class Server:
    url: str
    analyst: Client
    officer: Client
    outsider: Client
    tokens: dict


def make_client(url: str, token: str | None, **kw) -> Client:
    # quick polling: requests here take milliseconds
    kw.setdefault("backoff", Backoff(first=0.02, factor=1.5, cap=0.2, long_poll=1.0))
    kw.setdefault("progress", False)
    return Client(url, token=token, **kw)


@pytest.fixture(autouse=True)
def _no_persistent_connections(request, monkeypatch):
    """The live server answers each request in a thread of its own: with persistent
    connections (DB_CONN_MAX_AGE) those threads would leave PostgreSQL sessions open on the
    test database, and it could not be dropped at the end."""
    if "live_server" in request.fixturenames:
        from django.db import connection

        monkeypatch.setitem(connection.settings_dict, "CONN_MAX_AGE", 0)


@pytest.fixture
def server(live_server, make_dataset, officer, analyst, analyst2, grant) -> Server:
    """A live server with dataset ``clinic`` (granted to ann, not to bob) and a client per role."""
    ds = make_dataset("clinic", epsilon=20.0, unit_column="patient_id", schema=SCHEMA)
    grant(analyst, ds)
    tokens = {u.username: Token.objects.get_or_create(user=u)[0].key for u in (officer, analyst, analyst2)}
    return Server(url=live_server.url, analyst=make_client(live_server.url, tokens["ann"]),
                  officer=make_client(live_server.url, tokens["olivia"]),
                  outsider=make_client(live_server.url, tokens["bob"]), tokens=tokens)
