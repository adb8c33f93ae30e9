"""The audit API and exports: who may read them, and that the JSON export re-composes to
the totals it states (with this service's accountants; tools/recompose_audit.py does it
with independent ones)."""

import csv
import io
import json

import pytest
from django.core.management import call_command

from governance.ledger import trail
from accounting import ACCOUNTANTS, parse_event
from accounting.costs import cost_of, resolve
from governance.models import AuditRecord

pytestmark = pytest.mark.django_db


ENDPOINTS = [
    ("get", "/api/audit/"),
    ("get", "/api/audit/verify/"),
    ("get", "/api/audit/export/?dataset=survey&format=json"),
    ("get", "/api/audit/export/?dataset=survey&format=csv"),
]


@pytest.mark.parametrize("method,url", ENDPOINTS)
@pytest.mark.parametrize("role,expected", [("officer", 200), ("auditor", 200), ("analyst", 403),
                                           ("outsider", 403), ("anonymous", 401)])
def test_audit_endpoints_by_role(history, api, officer, auditor, analyst, outsider, role, expected, method, url):
    user = {"officer": officer, "auditor": auditor, "analyst": analyst, "outsider": outsider,
            "anonymous": None}[role]
    r = getattr(api(user), method)(url)
    assert r.status_code == expected, (role, url, r.content[:300])


@pytest.mark.parametrize("method,url", [
    ("get", "/api/datasets/"), ("get", "/api/requests/"), ("get", "/api/ledger/"), ("get", "/api/grants/"),
])
def test_auditors_see_no_data_results_or_requests(history, api, auditor, method, url):
    r = getattr(api(auditor), method)(url)
    assert r.status_code == 200 and r.json()["results"] == []


def test_auditors_cannot_change_or_ask(history, api, auditor):
    ds, _ = history
    c = api(auditor)
    assert c.get(f"/api/datasets/{ds.name}/").status_code == 404
    assert c.post("/api/requests/", {"dataset": ds.name, "engine": "aggregates", "kind": "count",
                                     "params": {"epsilon": 0.1}}, format="json").status_code == 400
    assert c.post(f"/api/datasets/{ds.name}/charges/", {"event": {"kind": "laplace", "epsilon": 0.1}},
                  format="json").status_code in (403, 404)
    assert c.post("/api/grants/", {"analyst": "audrey", "dataset": ds.name}, format="json").status_code == 403
    assert c.get("/api/me/").json()["role"] == "auditor"


def test_officers_create_auditors_who_cannot_hold_grants(history, api, officer):
    ds, _ = history
    r = api(officer).post("/api/analysts/", {"username": "ivy", "role": "auditor"}, format="json")
    assert r.status_code == 201 and r.json()["role"] == "auditor"
    r = api(officer).post("/api/grants/", {"analyst": "ivy", "dataset": ds.name}, format="json")
    assert r.status_code == 400 and "Auditors" in json.dumps(r.json())


def test_records_list_filters(history, api, auditor):
    ds, counts = history
    r = api(auditor).get("/api/audit/", {"dataset__name": ds.name, "action": "refuse", "page_size": 1000})
    body = r.json()
    assert body["count"] == counts["refuse"] and all(x["action"] == "refuse" for x in body["results"])
    r = api(auditor).get("/api/audit/", {"actor": "ann", "page_size": 1000})
    assert r.json()["count"] > 0 and all(x["actor"] == "ann" for x in r.json()["results"])


def test_json_export_recomposes_to_its_totals(history, api, auditor):
    ds, counts = history
    r = api(auditor).get("/api/audit/export/", {"dataset": ds.name, "format": "json"})
    assert r.status_code == 200 and r["Content-Type"] == "application/json"
    assert r["Content-Disposition"] == f'attachment; filename="audit-{ds.name}.json"'
    export = json.loads(r.getvalue())
    assert export["format"] == "privacy-audit/1" and export["verification"]["ok"] is True
    (d,) = export["datasets"]
    assert len(d["records"]) == sum(counts.values()) and d["counts"]["refuse"] == counts["refuse"]
    # re-hash
    prev = export["hashing"]["genesis"]
    for rec in d["records"]:
        body = {k: v for k, v in rec.items() if k != "hash"}
        assert rec["prev_hash"] == prev and trail.digest(body) == rec["hash"]
        prev = rec["hash"]
    assert prev == d["head"]["hash"]
    # re-compose the committed events from the export alone
    events = [parse_event(rec["event"]) for rec in d["records"] if rec["action"] == "commit"]
    delta = d["totals"]["at_delta"]
    for name, acc in ACCOUNTANTS.items():
        total = None
        for e in events:
            c = cost_of(resolve(e, 1e-300))
            total = c if total is None else total + c
        assert acc.spent(total, delta).epsilon == pytest.approx(d["totals"][name]["epsilon"], rel=1e-9)
    assert d["spent_filter"][d["budget"]["policy"]] <= d["budget"]["epsilon"]


def test_csv_export_neutralises_formulas(history, tamperer, api, officer):
    ds, _ = history
    rec = AuditRecord.objects.filter(dataset=ds).first()
    from django.db import connection

    with connection.cursor() as cur:  # a reference an attacker chose, e.g. through a request parameter
        cur.execute(f"UPDATE {AuditRecord._meta.db_table} SET reference = %s WHERE id = %s",
                    ['=HYPERLINK("http://evil")', rec.pk])
    r = api(officer).get("/api/audit/export/", {"dataset": ds.name, "format": "csv"})
    rows = list(csv.DictReader(io.StringIO(r.getvalue().decode())))
    assert len(rows) == AuditRecord.objects.filter(dataset=ds).count()
    assert rows[0]["reference"] == "'=HYPERLINK(\"http://evil\")"
    assert all(not row["reference"].startswith("=") for row in rows)
    details = set(AuditRecord.objects.filter(dataset=ds).exclude(detail="").values_list("detail", flat=True))
    assert details and {row["detail"] for row in rows} >= details  # a refusal's reason in words, as in the JSON


def test_a_carriage_return_in_a_cell_keeps_its_record_one_row(history, api, officer):
    """A lone CR went out unquoted: csv.reader and spreadsheets read one record as two, its
    charge moved into other columns (a probe's officer reference "quarterly report\\rshared").
    Served as UTF-8, which it is (a look-alike actor came back as mojibake)."""
    ds = history[0]
    charged = api(officer).post(f"/api/datasets/{ds.name}/charges/", {
        "event": {"kind": "laplace", "epsilon": 0.001}, "reference": "quarterly report\rshared \u0430"}, format="json")
    assert charged.status_code == 201, charged.content
    r = api(officer).get("/api/audit/export/", {"dataset": ds.name, "format": "csv"})
    assert r["Content-Type"] == "text/csv; charset=utf-8"
    rows = list(csv.reader(io.StringIO(r.getvalue().decode(), newline="")))
    assert len(rows) == 1 + AuditRecord.objects.filter(dataset=ds).count()
    assert {len(row) for row in rows} == {len(rows[0])}
    # shown as its escape, as every control character but the line feed (a terminal acts on
    # them: manage.py audit export prints to one); the JSON export has the value exact
    assert "quarterly report\\u000dshared \u0430" in {row[rows[0].index("reference")] for row in rows}


def test_pdf_export(history, api, auditor):
    r = api(auditor).get("/api/audit/export/", {"dataset": history[0].name, "format": "pdf"})
    assert r.status_code == 200 and r["Content-Type"] == "application/pdf" and r.content[:5] == b"%PDF-"


@pytest.mark.parametrize("query,fragment", [({"format": "json"}, "name a dataset"),
                                            ({"dataset": "nope"}, "no dataset named nope"),
                                            ({"dataset": ["all", "survey"]}, "give it alone"),
                                            ({"dataset": "survey", "format": "xls"}, "format must be")])
def test_export_bad_input_is_a_400(history, api, officer, query, fragment):
    r = api(officer).get("/api/audit/export/", query)
    assert r.status_code == 400 and fragment in r.json()["detail"]


def test_export_command_writes_each_format(history, tmp_path):
    ds, _ = history
    for fmt in ("json", "csv", "pdf"):
        out = tmp_path / f"a.{fmt}"
        call_command("audit", "export", "--dataset", ds.name, "--format", fmt, "--output", str(out),
                     stdout=io.StringIO())
        assert out.stat().st_size > 500
    assert json.loads((tmp_path / "a.json").read_text())["datasets"][0]["name"] == ds.name
    assert (tmp_path / "a.pdf").read_bytes()[:5] == b"%PDF-"


def test_an_export_printed_to_a_terminal_carries_no_control_character(history, api, officer):
    """An officer's reference with ESC sequences (clear the screen, set the window title) and
    C1 controls (U+009B: a CSI) reached the terminal raw through ``audit export``'s stdout.
    They are escapes now; the JSON export still holds the exact value."""
    ds, _ = history
    reference = "q\x1b[2J\x1b]0;owned\x07 \u009b31m \x7f end"
    r = api(officer).post(f"/api/datasets/{ds.name}/charges/", {"event": {"kind": "laplace", "epsilon": 0.001},
                                                                "reference": reference}, format="json")
    assert r.status_code == 201, r.content
    for fmt in ("json", "csv"):
        out = io.StringIO()
        call_command("audit", "export", "--dataset", ds.name, "--format", fmt, stdout=out)
        text = out.getvalue()
        assert not [c for c in text if (ord(c) < 0x20 and c not in "\t\n\r") or 0x7f <= ord(c) < 0xa0], fmt
        if fmt == "json":
            refs = [rec["reference"] for rec in json.loads(text)["datasets"][0]["records"]]
            assert reference in refs
        else:
            assert "q\\u001b[2J\\u001b]0;owned\\u0007 \\u009b31m \\u007f end" in text


def test_records_dates_past_year_9999_in_utc_are_a_400(history, api, auditor):
    """9999-12-31T23:59:59-01:00 is in year 10000 in UTC: SQLite's adapter overflowed, a 500."""
    for query in ({"at__gte": "9999-12-31T23:59:59-01:00"}, {"at__lte": "0001-01-01T00:00:00+01:00"}):
        r = api(auditor).get("/api/audit/", query)
        assert r.status_code == 400 and "outside years 1-9999" in json.dumps(r.json()), r.content
    r = api(auditor).get("/api/audit/", {"at__gte": "2000-01-01T00:00:00+01:00", "page_size": 1})
    assert r.status_code == 200 and r.json()["count"] > 0


def test_a_dataset_named_twice_is_exported_once(history, api, auditor):
    ds, _ = history
    def csv(query):
        r = api(auditor).get("/api/audit/export/?" + query)
        assert r.status_code == 200
        return b"".join(r.streaming_content)

    assert csv(f"dataset={ds.name}&dataset={ds.name}&format=csv") == csv(f"dataset={ds.name}&format=csv")
    body = json.loads(b"".join(api(auditor).get(f"/api/audit/export/?dataset={ds.name}&dataset={ds.name}")
                               .streaming_content))
    assert [d["name"] for d in body["datasets"]] == [ds.name]


def test_all_is_not_a_dataset_name(make_dataset):
    from governance.core.errors import InvalidDataset

    with pytest.raises(InvalidDataset, match="reserved"):
        make_dataset("all")


def test_the_officers_verify_says_an_unknown_name_and_reads_all_as_every_dataset(history, tamperer, client, officer):
    from django.contrib.messages import get_messages
    from django.urls import reverse

    from governance.models import AuditRecord

    ds, _ = history
    client.force_login(officer)
    url = reverse("admin:governance_audit_verify")

    def said(query):
        r = client.get(url, query)
        assert r.status_code == 302
        return str(list(get_messages(r.wsgi_request))[-1])  # this request's (the redirect was not followed)

    assert said({"dataset": "all"}).startswith("Audit chain verified") and " 0 records" not in said({})
    AuditRecord.objects.filter(dataset=ds, seq=3).update(actor="mallory")
    for query in ({"dataset": "all"}, {}, {"dataset": ds.name}):
        assert said(query).startswith("Audit chain BROKEN"), query
    assert said({"dataset": "survy"}) == "Audit chain not verified: no dataset named survy."
