"""Federated datasets through the REST API (issue 27): registration with a declared schema
and sites (no table), bad input as 400s with the reason, the engine/dataset match, and site
secrets that only privacy officers are ever handed."""

import pytest
from django.contrib.auth.models import Group

from governance.datasets.federated import site_secret
from governance.models import Dataset, FederatedSite, Request
from tests.api.conftest import assert_error

pytestmark = pytest.mark.django_db

SCHEMA = [
    {"name": "x1", "type": "numeric", "lower": -3.0, "upper": 3.0},
    {"name": "x2", "type": "numeric", "lower": -3.0, "upper": 3.0},
    {"name": "color", "type": "categorical", "domain": ["red", "green", "blue"]},
    {"name": "label", "type": "categorical", "domain": ["no", "yes"]},
]
SITES = [{"site": "h1", "n_rows": 400}, {"site": "h2", "n_rows": 300}, {"site": "h3", "n_rows": 500}]
TRAIN = {"target": "label", "rounds": 2, "target_epsilon": 2.0}


def body(**kw):
    return {"name": "clinics", "execution": "federated", "schema": SCHEMA, "sites": SITES, "budget_epsilon": 5.0,
            "activate": True, **kw}


@pytest.fixture
def clinics(api, officer):
    r = api(officer).post("/api/datasets/", body(), format="json")
    assert r.status_code == 201, r.content
    return Dataset.objects.get(name="clinics")


def test_it_registers_a_federated_dataset_with_its_sites_and_no_file(api, officer):
    r = api(officer).post("/api/datasets/", body(), format="json")
    assert r.status_code == 201, r.content
    d = r.json()
    assert d["execution"] == "federated" and d["status"] == "active"
    assert d["n_rows"] == d["n_units"] == 1200
    assert d["sites"] == SITES
    assert [c["name"] for c in d["columns"]] == ["x1", "x2", "color", "label"]
    assert d["budget_delta"] == pytest.approx(1 / 1200**1.2)
    ds = Dataset.objects.get(name="clinics")
    assert ds.file == "" and list(ds.sites.values_list("site", "n_rows")) == [("h1", 400), ("h2", 300), ("h3", 500)]
    assert "secret" not in r.content.decode()


@pytest.mark.parametrize("change, field, reason", [
    ({"sites": SITES + [{"site": "h1", "n_rows": 10}]}, "sites", "declared twice"),
    ({"sites": [{"site": "h1", "n_rows": -5}]}, "sites", "n_rows must be a whole number"),
    ({"sites": [{"site": "h1", "n_rows": 0}]}, "sites", "n_rows must be a whole number"),
    ({"sites": [{"site": "h1", "n_rows": 2.5}]}, "sites", "n_rows must be a whole number"),
    ({"sites": [{"site": "bad id!", "n_rows": 5}]}, "sites", "site id must be"),
    # "$" matched before a final newline: "h1\n" beside "h1" doubled the rows (a helper's probe)
    ({"sites": SITES + [{"site": "h1\n", "n_rows": 400}]}, "sites", "site id must be"),
    ({"sites": [{"site": "h1", "n_rows": 5, "key": "x"}]}, "sites", "must be {"),
    ({"sites": []}, "sites", "needs its sites"),
    ({"sites": {"h1": 5}}, "sites", "needs its sites"),
    ({"schema": [{"name": "x1", "lower": 0, "upper": 1}]}, "x1", "declare its type"),
    ({"schema": [{"name": "x1", "type": "numeric", "lower": 3, "upper": 1}]}, "x1", "must be below"),
    ({"schema": [{"name": "c", "type": "categorical"}]}, "c", "non-empty 'domain'"),
    ({"schema": [{"name": "p", "type": "unit"}]}, "p", "no privacy-unit column"),
    ({"path": "/etc/passwd"}, "execution", "no file or path"),
    ({"schema": None}, "schema", ""),
    ({"unit_column": "x1"}, "unit_column", "no privacy-unit column"),
])
def test_bad_registrations_are_400s_with_the_reason(api, officer, change, field, reason):
    data = body(**change)
    data = {k: v for k, v in data.items() if v is not None}
    r = api(officer).post("/api/datasets/", data, format="json")
    err = assert_error(r, 400)
    assert reason in str(err), err
    assert field in str(err), err
    assert not Dataset.objects.filter(name="clinics").exists() and not FederatedSite.objects.exists()


def test_sites_are_refused_on_a_dataset_that_is_not_federated(api, officer, import_dir, csv_bytes):
    (import_dir / "t.csv").write_bytes(csv_bytes)
    r = api(officer).post("/api/datasets/", {"name": "t", "path": str(import_dir / "t.csv"), "budget_epsilon": 1.0,
                                             "sites": SITES}, format="json")
    assert "Only a federated dataset" in str(assert_error(r, 400))


def test_a_federated_dataset_runs_only_federated_engines_and_vice_versa(api, analyst, clinics, make_dataset, grant):
    grant(analyst, clinics)
    local = make_dataset("local")
    grant(analyst, local)
    client = api(analyst)
    r = client.post("/api/requests/", {"dataset": "clinics", "engine": "aggregates", "kind": "count",
                                       "params": {"epsilon": 0.5}}, format="json")
    err = assert_error(r, 400, "request.invalid")
    assert "only a federated engine runs on it" in err["detail"] and "engine" in err["errors"]
    r = client.post("/api/requests/", {"dataset": "clinics", "engine": "dpsgd", "kind": "train",
                                       "params": {"target": "label", "target_epsilon": 1.0}}, format="json")
    assert_error(r, 400, "request.invalid")
    r = client.post("/api/requests/", {"dataset": "local", "engine": "federated", "kind": "train",
                                       "params": {"target": "site", "target_epsilon": 1.0}}, format="json")
    assert "'local' is not federated" in assert_error(r, 400, "request.invalid")["detail"]
    r = client.post("/api/datasets/clinics/estimate/", {"engine": "aggregates", "kind": "count",
                                                        "params": {"epsilon": 0.5}}, format="json")
    assert_error(r, 400, "request.invalid")
    assert not Request.objects.exists()


def test_the_federated_engine_plans_on_the_registered_sites(api, analyst, clinics, grant):
    grant(analyst, clinics)
    r = api(analyst).post("/api/datasets/clinics/estimate/", {"engine": "federated", "kind": "train",
                                                              "params": {**TRAIN, "sites_per_round": 1.5}},
                          format="json")
    assert r.status_code == 200, r.content
    event = r.json()["request"] if "request" in r.json() else None
    assert event is not None
    assert r.json()["total"]["rdp"]["epsilon"] == pytest.approx(2.0, rel=0.02)
    r = api(analyst).post("/api/datasets/clinics/estimate/", {"engine": "federated", "kind": "train",
                                                              "params": {**TRAIN, "target": "nope"}}, format="json")
    assert_error(r, 400)


def test_only_officers_are_handed_a_site_secret(api, officer, analyst, clinics, grant, django_user_model):
    grant(analyst, clinics)
    auditor = django_user_model.objects.create_user("audrey")
    auditor.groups.add(Group.objects.get_or_create(name="auditors")[0])
    url = "/api/datasets/clinics/sites/h2/secret/"
    assert_error(api(analyst).post(url), 403)
    assert_error(api(auditor).post(url), 403)
    assert_error(api().post(url), 401)
    assert FederatedSite.objects.get(site="h2").secret_issued_at is None
    r = api(officer).post(url)
    assert r.status_code == 200, r.content
    assert r.json()["secret"] == site_secret("clinics", "h2") and len(r.json()["secret"]) == 64
    assert "--site h2" in r.json()["agent"]
    assert FederatedSite.objects.get(site="h2").secret_issued_at is not None
    assert_error(api(officer).post("/api/datasets/clinics/sites/nope/secret/"), 400)
    # secrets differ per site and per dataset, and appear nowhere an analyst reads
    secrets = {site_secret("clinics", s["site"]) for s in SITES}
    assert len(secrets) == 3 and site_secret("other", "h2") not in secrets
    for path in ("/api/datasets/", "/api/datasets/clinics/", "/api/engines/"):
        text = api(analyst).get(path).content.decode()
        assert not any(s in text for s in secrets), path


def test_a_secret_handed_out_is_a_site_key_record_in_the_audit_chain(api, officer, clinics, tmp_path):
    """Who was handed which site's secret: a record in the dataset's chain (no charge), which
    the service's verification and the third party's tools/recompose_audit.py both accept."""
    import json
    import subprocess
    import sys
    from pathlib import Path

    from governance.audit.verification import verify
    from governance.models import AuditRecord

    assert api(officer).post("/api/datasets/clinics/sites/h2/secret/").status_code == 200
    assert_error(api(officer).post("/api/datasets/clinics/sites/nope/secret/"), 400)  # refused: no record
    (rec,) = AuditRecord.objects.filter(dataset__name="clinics", action="site_key")
    assert (rec.action, rec.actor, rec.outcome, rec.charge, rec.ledger_entry_id) == ("site_key", officer.username,
                                                                                    "issued", None, None)
    assert "'h2'" in rec.detail and site_secret("clinics", "h2") not in json.dumps(rec.detail)
    assert verify().ok
    r = api(officer).get("/api/audit/export/?dataset=clinics&format=json")
    assert r.status_code == 200
    export = r.getvalue()
    (tmp_path / "export.json").write_bytes(export)
    ds = next(d for d in json.loads(export)["datasets"] if d["name"] == "clinics")
    assert ds["counts"]["site_key"] == 1
    tool = Path(__file__).resolve().parents[2] / "tools" / "recompose_audit.py"
    out = subprocess.run([sys.executable, str(tool), str(tmp_path / "export.json")], capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "1 site_key" in out.stdout


def test_the_management_command_registers_lists_and_hands_out_secrets(officer, tmp_path):
    import json

    from django.core.management import call_command
    from django.core.management.base import CommandError

    (tmp_path / "schema.json").write_text(json.dumps(SCHEMA))
    call_command("federated", "register", "wards", "--schema", f"@{tmp_path / 'schema.json'}", "--site", "a=100",
                 "--site", "b=250", "--budget-epsilon", "3", "--activate")
    ds = Dataset.objects.get(name="wards")
    assert ds.execution == "federated" and ds.n_rows == 350 and ds.status == "active"
    out = tmp_path / "a.secret"
    call_command("federated", "secret", "wards", "a", "--out", str(out))
    assert out.read_text() == site_secret("wards", "a") and (out.stat().st_mode & 0o777) == 0o600
    assert ds.audit_records.get(action="site_key").actor == "manage.py"
    with pytest.raises(CommandError, match="n_rows must be"):
        call_command("federated", "register", "w2", "--schema", json.dumps(SCHEMA), "--site", "a=-1",
                     "--budget-epsilon", "1")
    with pytest.raises(CommandError, match="not a site of"):
        call_command("federated", "secret", "wards", "zz")
    for bad in (tmp_path / "no" / "dir" / "b.secret", tmp_path):  # no secret issued for a path it cannot write
        with pytest.raises(CommandError, match="cannot write"):
            call_command("federated", "secret", "wards", "b", "--out", str(bad))
    assert ds.sites.get(site="b").secret_issued_at is None and ds.audit_records.count() == 2
    with pytest.raises(CommandError, match="not JSON"):
        call_command("federated", "register", "w3", "--schema", "[" * 3000 + "]" * 3000, "--site", "a=1",
                     "--budget-epsilon", "1")
