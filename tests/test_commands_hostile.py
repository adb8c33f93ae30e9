"""Management commands given hostile arguments answer with one line (CommandError, a
non-zero exit), never a traceback, and change nothing."""

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError

pytestmark = pytest.mark.django_db


@pytest.mark.parametrize("content", [b"\x89PNG\r\n\x1a\n\x00\xff\xfe", "[" * 3000 + "]" * 3000, "1" * 5000,
                                     '[{"kind": "laplace", "epsilon": NaN}]'])
def test_compose_refuses_a_file_that_is_not_json_events(tmp_path, content):
    path = tmp_path / "events.json"
    (path.write_bytes if isinstance(content, bytes) else path.write_text)(content)
    with pytest.raises(CommandError):
        call_command("compose", str(path), "--delta", "1e-6")


def test_compose_refuses_events_whose_deltas_add_up_past_one(tmp_path):
    path = tmp_path / "events.json"
    path.write_text('[{"kind": "epsilon_delta", "epsilon": 0.5, "delta": 0.9}, '
                    '{"kind": "epsilon_delta", "epsilon": 0.5, "delta": 0.9}]')
    with pytest.raises(CommandError, match="add up to 1.8"):
        call_command("compose", str(path), "--delta", "1e-6")


def test_audit_export_refuses_an_output_it_cannot_write(make_dataset, tmp_path):
    make_dataset("clinic")
    for bad in (tmp_path, "/proc/version"):
        with pytest.raises(CommandError):
            call_command("audit", "export", "--dataset", "clinic", "--format", "json", "--output", str(bad))


def test_audit_export_replaces_a_file_only_when_told(make_dataset, tmp_path):
    make_dataset("clinic")
    out = tmp_path / "keep.txt"
    out.write_text("someone's file\n")
    with pytest.raises(CommandError, match="--force"):
        call_command("audit", "export", "--dataset", "clinic", "--format", "json", "--output", str(out))
    assert out.read_text() == "someone's file\n"
    call_command("audit", "export", "--dataset", "clinic", "--format", "json", "--output", str(out), "--force")
    assert out.read_text().startswith("{")


@pytest.mark.parametrize("value", ["nan", "inf", "-1", "0", "1e308"])
def test_recover_refuses_a_duration_that_is_not_one(value):
    with pytest.raises(CommandError, match="lost-after"):
        call_command("recover", "--lost-after", value)


@pytest.mark.parametrize("args", [["--concurrency", "-1"], ["-c", "0"], ["-c", "x"], ["-c", "100000"],
                                  ["-Q", ""], ["-Q", "cpu,,gpu"], ["-Q", "cpu;rm"]])
def test_worker_refuses_arguments_celery_would_trace_back_on(monkeypatch, args):
    from workers import app

    started = []
    monkeypatch.setattr(app, "worker_main", lambda argv: started.append(argv))
    with pytest.raises(CommandError):
        call_command("worker", *args)
    assert started == []
    call_command("worker", "-c", "2", "-Q", "cpu")
    assert started and started[0][:4] == ["worker", "-Q", "sweep,cpu", "-c"]  # the sweep's own queue, always
