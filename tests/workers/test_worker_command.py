"""``manage.py worker``: Celery beat (the recovery sweep) runs in the worker by default on the
embedded broker, where one machine has no separate beat process; not with Redis."""

import pytest
from django.core.management import call_command


@pytest.fixture
def argv(monkeypatch):
    from workers import app

    seen = []
    monkeypatch.setattr(app, "worker_main", lambda args: seen.append(args))
    return seen


@pytest.mark.parametrize("embedded, flag, beats", [
    (True, None, True), (False, None, False), (True, "--no-beat", False), (False, "--beat", True),
])
def test_beat_follows_the_broker_unless_asked(argv, settings, embedded, flag, beats):
    settings.EMBEDDED_BROKER = embedded
    call_command("worker", *([flag] if flag else []))
    assert ("--beat" in argv[0]) is beats
    if beats:
        assert argv[0][argv[0].index("--schedule") + 1].endswith("celerybeat-schedule")
