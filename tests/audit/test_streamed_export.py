"""The JSON and CSV exports are streamed (governance/audit/export.py ``stream``): what the
whole export gives, in pieces read in one snapshot, in memory that does not grow with the
trail. Built whole, 68,000 records took 1 GB (the record dicts, their text, the bytes) and
verification held every ledger entry with its cost curve."""

import csv
import io
import json
import tracemalloc

import pytest
from django.core.management import call_command

from governance.audit import export as audit_export, verification
from governance.ledger import actions as ledger, trail
from governance.models import AuditRecord

from .conftest import build_history

pytestmark = pytest.mark.django_db


def _without_time(export: dict) -> dict:
    return {k: v for k, v in export.items() if k != "generated_at"}


@pytest.fixture
def two(history, make_dataset, grant, analyst):
    other = make_dataset("clinic", epsilon=2.0)
    grant(analyst, other)
    build_history(other, [analyst], n=12)
    return [history[0], other, history[0]]  # a name twice: as ?dataset=survey&dataset=clinic&dataset=survey


def test_the_streamed_export_is_the_whole_one_in_pieces(two, monkeypatch, officer):
    monkeypatch.setattr(audit_export, "STREAM_RECORDS", 4)
    pieces = list(audit_export.stream(two, officer, "json"))
    whole = audit_export.build(two, officer)
    assert _without_time(json.loads(b"".join(pieces))) == _without_time(whole)
    n = sum(len(d["records"]) for d in whole["datasets"])
    assert n > 40 and len(pieces) >= n / 4  # a piece per 4 records, not one text
    csv_pieces = list(audit_export.stream(two, officer, "csv"))
    assert b"".join(csv_pieces) == audit_export.to_csv(whole) and len(csv_pieces) >= n / 4
    assert len(list(csv.DictReader(io.StringIO(b"".join(csv_pieces).decode())))) == n


def test_the_api_and_the_pages_stream_json_and_csv(history, api, auditor, client):
    ds, _ = history
    for fmt in ("json", "csv"):
        r = api(auditor).get("/api/audit/export/", {"dataset": ds.name, "format": fmt})
        assert r.status_code == 200 and r.streaming, fmt
        assert r["Content-Disposition"] == f'attachment; filename="audit-{ds.name}.{fmt}"'
    client.force_login(auditor)
    r = client.get(f"/auditor/export/?dataset={ds.name}&format=json")
    assert r.streaming and json.loads(r.getvalue())["verification"]["ok"] is True


def _peak(fn) -> int:
    tracemalloc.start()
    try:
        fn()
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def test_memory_does_not_grow_with_the_trail(make_dataset, grant, analyst, monkeypatch):
    monkeypatch.setattr(audit_export, "STREAM_RECORDS", 25)  # chunks of 25: 150 records are 6
    monkeypatch.setattr(verification, "CHUNK", 25)
    monkeypatch.setattr(ledger, "STATE_CHUNK", 25)
    ds = make_dataset("big", epsilon=1e6)
    grant(analyst, ds)

    def grow(n):
        for i in range(n):
            if i % 4 == 0:  # commits hold ledger entries with their cost curves; replays are records only
                ledger.commit(ledger.admit(ds, analyst, {"kind": "gaussian", "noise_multiplier": 1e4}),
                              audit_ctx=trail.Context(outcome="succeeded", engine="aggregates", kind="count"))
            else:
                trail.record_replay(ds, analyst, trail.Context(engine="aggregates", kind="count", params={"i": i}))

    def streamed():
        for _ in audit_export.stream([ds], None, "json"):
            pass

    def whole():
        audit_export.to_json(audit_export.build([ds]))

    def digested():  # what the PDF report is drawn from: at most MAX_POINTS records' totals (50 here)
        audit_export.build_digested([ds])

    from governance.audit import pdf, pdf_parts

    monkeypatch.setattr(pdf, "_sample", lambda n: pdf_parts._sample(n, 50))

    grow(150)
    small = (_peak(streamed), _peak(lambda: verification.verify([ds])), _peak(whole), _peak(digested))
    grow(1350)
    assert AuditRecord.objects.filter(dataset=ds).count() > 1500
    large = (_peak(streamed), _peak(lambda: verification.verify([ds])), _peak(whole), _peak(digested))
    # ten times the records: the whole export's memory grows with them; the verification's
    # does not (chunks of 50), the stream's and the PDF's digest by their summaries alone
    # (a refined charge per commit)
    assert large[2] > 5 * small[2], (small, large)
    assert large[1] < 2 * small[1], (small, large)
    assert large[0] - small[0] < (large[2] - small[2]) / 5, (small, large)
    assert large[3] - small[3] < (large[2] - small[2]) / 5, (small, large)


def test_the_pdf_drawn_from_the_digest_is_the_pdf_of_the_whole_export(two, monkeypatch, officer):
    """The PDF report is drawn from the records digested as they are read: the same
    document as from every record held, burn-down sampling and last records included."""
    from governance.audit import pdf, pdf_parts

    monkeypatch.setattr(pdf, "_sample", lambda n: pdf_parts._sample(n, 7))  # 30 records: every 5th plotted
    monkeypatch.setattr(pdf_parts, "MAX_POINTS", 7)
    monkeypatch.setattr(pdf, "LAST_RECORDS", 9)
    whole = audit_export.build(two, officer)
    lean = audit_export.build_digested(two, officer)
    lean["generated_at"] = whole["generated_at"]
    assert all("records" not in d and len(d["digest"]["last"]) == 9 for d in lean["datasets"])
    assert lean["datasets"][0]["digest"]["n_records"] == len(whole["datasets"][0]["records"]) > 9
    assert len(lean["datasets"][0]["digest"]["burndown"]) < lean["datasets"][0]["digest"]["n_records"]  # sampled
    assert pdf.render_pdf(lean, compress=False) == pdf.render_pdf(whole, compress=False)


def test_an_export_command_that_fails_midway_leaves_no_file(history, monkeypatch, tmp_path):
    ds, _ = history

    def failing(*args):
        yield b'{"format": '
        raise RuntimeError("the database went away")

    monkeypatch.setattr(audit_export, "stream", failing)
    out = tmp_path / "out" / "a.json"
    with pytest.raises(RuntimeError):
        call_command("audit", "export", "--dataset", ds.name, "--format", "json", "--output", str(out),
                     stdout=io.StringIO())
    assert list(out.parent.iterdir()) == []  # neither the file nor its part


def test_the_first_records_go_out_before_the_verification(history, monkeypatch):
    """A proxy's read timeout (nginx: 60 s) never waits on a verification of the whole
    trail: the records stream at once, the verification is read last."""
    called = []
    real = audit_export.verify
    monkeypatch.setattr(audit_export, "verify", lambda *a, **kw: called.append(1) or real(*a, **kw))
    pieces = audit_export.stream([history[0]], None, "json")
    head, records = next(pieces), next(pieces) + next(pieces)  # the dataset's opening, its first records
    assert b'"format": "privacy-audit/1"' in head and b'"records": [{' in records and not called
    assert json.loads(head + records + b"".join(pieces))["verification"]["ok"] is True and called == [1]
