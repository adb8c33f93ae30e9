"""An officer's change of a dataset's budget or of a privacy setting is a ``settings`` record
in the dataset's audit chain (who, and each setting's old and new value), and a grant
given, re-capped or revoked a ``grant`` record (who, for which analyst, the caps before and
after): written in the same transaction as the change (a refused change, or one that
changes nothing, leaves none), accepted by the service's verification and by the third
party's tools/recompose_audit.py."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from governance.audit.verification import verify
from governance.ledger import actions as ledger
from governance.models import AuditRecord, Dataset

pytestmark = pytest.mark.django_db

TOOL = Path(__file__).resolve().parents[2] / "tools" / "recompose_audit.py"


def _exported_and_recomposed(api, officer, tmp_path) -> tuple[dict, str]:
    """The JSON export of "clinic", and what the third party's tool printed (it passed)."""
    r = api(officer).get("/api/audit/export/?dataset=clinic&format=json")
    assert r.status_code == 200
    (tmp_path / "export.json").write_bytes(r.getvalue())
    out = subprocess.run([sys.executable, str(TOOL), str(tmp_path / "export.json")], capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr
    return json.loads((tmp_path / "export.json").read_text()), out.stdout


def _settings(name="clinic", action="settings"):
    """The officers' changes (the registration's own settings record left out)."""
    return list(AuditRecord.objects.filter(dataset__name=name, action=action).exclude(outcome="registered")
                .order_by("seq"))


def test_a_registration_is_the_first_settings_record_and_a_budget_raised_after_it_is_found(officer, make_dataset):
    """The values a dataset was registered with open its chain, so a budget raised in the
    database on a dataset no officer ever changed is found too."""
    ds = make_dataset(epsilon=1.0, delta=1e-6)
    (rec,) = AuditRecord.objects.filter(dataset=ds)
    assert (rec.seq, rec.action, rec.outcome, rec.actor, rec.charge) == (1, "settings", "registered",
                                                                         officer.username, None)
    assert rec.params["budget_epsilon"] == [None, 1.0] and rec.params["budget_delta"] == [None, 1e-6]
    assert rec.params["policy"] == [None, "rdp"] and rec.params["allow_non_private"] == [None, False]
    assert verify().ok
    Dataset.objects.filter(pk=ds.pk).update(budget_epsilon=100.0)
    result = verify()
    assert not result.ok and "budget_epsilon is 100.0, its last settings record set 1.0" in result.first_broken.problem


def test_a_table_read_by_a_worker_and_a_federated_dataset_are_recorded_when_registered(api, officer, settings,
                                                                                     django_capture_on_commit_callbacks):
    """A table read off the request thread: its record is written when the worker is done
    (its delta "auto" is known then), none while it is pending."""
    from tests.api.conftest import upload
    from tests.conftest import small_frame

    settings.REGISTER_INLINE_BYTES = 1000
    with django_capture_on_commit_callbacks(execute=False) as sent:
        r = api(officer).post("/api/datasets/", {"name": "big", "budget_epsilon": "2.0", "unit_column": "patient_id",
                                                 "file": upload(small_frame().to_csv(index=False).encode())},
                              format="multipart")
    assert r.status_code == 202, r.content
    assert not AuditRecord.objects.filter(dataset__name="big").exists()
    sent[0]()
    ds = Dataset.objects.get(name="big")
    (rec,) = AuditRecord.objects.filter(dataset=ds)
    assert rec.outcome == "registered" and rec.params["budget_delta"] == [None, ds.budget_delta]
    assert rec.params["delta_auto"] == [None, True] and ds.budget_delta < 1.0 / ds.n_units
    r = api(officer).post("/api/datasets/", {"name": "sites", "execution": "federated", "budget_epsilon": 3.0,
                                             "schema": {"columns": [{"name": "x", "type": "numeric", "lower": 0,
                                                                     "upper": 1}]},
                                             "sites": [{"site": "a", "n_rows": 100}]}, format="json")
    assert r.status_code == 201, r.content
    (rec,) = AuditRecord.objects.filter(dataset__name="sites")
    assert rec.outcome == "registered" and rec.params["budget_epsilon"] == [None, 3.0]
    assert verify().ok


def test_a_budget_raised_through_the_api_is_a_record_naming_the_officer(api, officer, analyst, grant, make_dataset,
                                                                      tmp_path):
    ds = make_dataset(epsilon=1.0)
    grant(analyst, ds)
    ledger.commit(ledger.admit(ds, analyst, {"kind": "laplace", "epsilon": 0.5}))
    r = api(officer).patch("/api/datasets/clinic/", {"budget_epsilon": 3.0, "allow_non_private": True},
                           format="json")
    assert r.status_code == 200, r.content
    (rec,) = _settings()
    assert (rec.actor, rec.outcome, rec.charge, rec.ledger_entry_id) == (officer.username, "changed", None, None)
    assert rec.params == {"budget_epsilon": [1.0, 3.0], "allow_non_private": [False, True]}
    assert "budget_epsilon 1.0 -> 3.0" in rec.detail
    assert rec.totals["basic"]["epsilon"] == pytest.approx(0.5)  # no charge: the committed spend as it was

    # the same values again, or a title, change no setting: no record
    assert api(officer).patch("/api/datasets/clinic/", {"budget_epsilon": 3.0, "title": "Clinic"},
                              format="json").status_code == 200
    assert len(_settings()) == 1
    # refused (below what is spent): the change and its record roll back together
    r = api(officer).patch("/api/datasets/clinic/", {"budget_epsilon": 0.1}, format="json")
    assert r.status_code == 400
    assert len(_settings()) == 1 and Dataset.objects.get(name="clinic").budget_epsilon == 3.0
    # an analyst cannot change it at all
    assert api(analyst).patch("/api/datasets/clinic/", {"budget_epsilon": 9.0}, format="json").status_code in (403, 404)
    assert len(_settings()) == 1

    assert verify().ok
    export, out = _exported_and_recomposed(api, officer, tmp_path)
    assert next(d for d in export["datasets"] if d["name"] == "clinic")["counts"]["settings"] == 2  # + registration
    assert "2 settings" in out
    # an export whose budget is not what the last settings record set: the tool says so
    forged = json.loads(json.dumps(export))
    next(d for d in forged["datasets"] if d["name"] == "clinic")["budget"]["epsilon"] = 50.0
    (tmp_path / "forged.json").write_text(json.dumps(forged))
    bad = subprocess.run([sys.executable, str(TOOL), str(tmp_path / "forged.json")], capture_output=True, text=True)
    assert bad.returncode != 0 and "the last settings record set budget_epsilon to 3.0" in bad.stdout
    from governance.audit.pdf import render_pdf

    from .test_pdf_report import pdf_text

    text = pdf_text(render_pdf(export, compress=False))
    assert "settings" in text and officer.username in text


def test_a_delta_changed_between_releases_keeps_the_chain_verifiable(api, officer, analyst, grant, make_dataset,
                                                                    tmp_path):
    """The totals are reported at the dataset's delta: a record after the change at the new
    one, and both verifiers re-derive each record at its own."""
    ds = make_dataset(epsilon=5.0, delta=1e-6)
    grant(analyst, ds)
    ledger.commit(ledger.admit(ds, analyst, {"kind": "gaussian", "noise_multiplier": 2.0}))
    assert api(officer).patch("/api/datasets/clinic/", {"budget_delta": 1e-8}, format="json").status_code == 200
    ds.refresh_from_db()
    ledger.commit(ledger.admit(ds, analyst, {"kind": "gaussian", "noise_multiplier": 2.0}))
    (rec,) = _settings()
    assert rec.params == {"budget_delta": [1e-6, 1e-8]} and rec.totals["at_delta"] == 1e-8
    assert verify().ok
    _exported_and_recomposed(api, officer, tmp_path)


def test_a_budget_changed_in_the_admin_is_a_record_and_a_forged_one_is_caught(client, officer, make_dataset, tamperer):
    ds = make_dataset(epsilon=1.0)
    client.force_login(officer)
    r = client.post(f"/admin/governance/dataset/{ds.pk}/change/",
                    {"title": "t", "description": "", "schema": json.dumps(ds.schema), "budget_epsilon": "2.0",
                     "budget_delta_text": "auto"})
    assert r.status_code == 302
    (rec,) = _settings()
    assert rec.actor == officer.username and rec.params["budget_epsilon"] == [1.0, 2.0]
    assert verify().ok
    # the record rewritten in the database (the old budget hidden) breaks the chain
    AuditRecord.objects.filter(pk=rec.pk).update(params=dict(rec.params, budget_epsilon=[2.0, 2.0]))
    result = verify()
    assert not result.ok and result.first_broken.seq == rec.seq


def test_a_grant_given_recapped_revoked_and_given_again_through_the_api(api, officer, analyst, make_dataset, tmp_path):
    make_dataset(epsilon=2.0)
    r = api(officer).post("/api/grants/", {"analyst": analyst.username, "dataset": "clinic", "cap_epsilon": 1.0},
                          format="json")
    assert r.status_code == 201, r.content
    gid = r.json()["id"]
    assert api(officer).post("/api/grants/", {"analyst": analyst.username, "dataset": "clinic"},
                             format="json").status_code == 400  # held already: no record
    assert api(officer).patch(f"/api/grants/{gid}/", {"cap_epsilon": 0.5}, format="json").status_code == 200
    assert api(officer).patch(f"/api/grants/{gid}/", {"cap_epsilon": 0.5}, format="json").status_code == 200  # same
    assert api(analyst).patch(f"/api/grants/{gid}/", {"cap_epsilon": 2.0}, format="json").status_code == 403
    assert api(officer).delete(f"/api/grants/{gid}/").status_code == 204
    assert api(officer).delete(f"/api/grants/{gid}/").status_code == 204  # revoked already: no record
    assert api(officer).post("/api/grants/", {"analyst": analyst.username, "dataset": "clinic"},
                             format="json").json()["id"] == gid
    got = [(r.outcome, r.actor, r.params["analyst"], r.params["cap_epsilon"], r.charge) for r in _settings(action="grant")]
    assert got == [("granted", officer.username, analyst.username, [None, 1.0], None),
                   ("changed", officer.username, analyst.username, [1.0, 0.5], None),
                   ("revoked", officer.username, analyst.username, [0.5, 0.5], None),
                   ("granted", officer.username, analyst.username, [None, None], None)]
    assert verify().ok
    export, out = _exported_and_recomposed(api, officer, tmp_path)
    assert next(d for d in export["datasets"] if d["name"] == "clinic")["counts"]["grant"] == 4
    assert "4 grant" in out


def test_a_grant_given_recapped_and_revoked_in_the_admin(client, officer, analyst, make_dataset):
    from governance.models import Grant

    ds = make_dataset()
    client.force_login(officer)
    assert client.post("/admin/governance/grant/add/", {"analyst": analyst.pk, "dataset": ds.pk, "cap_epsilon": "0.5",
                                                        "cap_delta": ""}).status_code == 302
    g = Grant.objects.get()
    assert g.created_by == officer and g.cap_epsilon == 0.5
    assert client.post(f"/admin/governance/grant/{g.pk}/change/", {"cap_epsilon": "0.25",
                                                                   "cap_delta": ""}).status_code == 302
    client.post("/admin/governance/grant/", {"action": "revoke", "_selected_action": [g.pk]})
    g.refresh_from_db()
    assert not g.active and g.cap_epsilon == 0.25
    assert [(r.outcome, r.actor, r.params["cap_epsilon"]) for r in _settings(action="grant")] == [
        ("granted", officer.username, [None, 0.5]), ("changed", officer.username, [0.5, 0.25]),
        ("revoked", officer.username, [0.25, 0.25])]
    assert verify().ok


def test_a_budget_or_a_cap_changed_in_the_database_without_a_record_is_found(api, officer, analyst, make_dataset):
    """After a settings or grant record, the dataset and the grant must be as the last
    record left them: an edit in the database (no record) is named by verify."""
    from governance.models import Grant

    make_dataset(epsilon=1.0)
    assert api(officer).patch("/api/datasets/clinic/", {"budget_epsilon": 2.0}, format="json").status_code == 200
    gid = api(officer).post("/api/grants/", {"analyst": analyst.username, "dataset": "clinic", "cap_epsilon": 0.5},
                            format="json").json()["id"]
    assert verify().ok
    Dataset.objects.filter(name="clinic").update(budget_epsilon=50.0)
    result = verify()
    assert not result.ok and "budget_epsilon is 50.0, its last settings record set 2.0" in result.first_broken.problem
    Dataset.objects.filter(name="clinic").update(budget_epsilon=2.0)
    assert verify().ok
    Grant.objects.filter(pk=gid).update(cap_epsilon=5.0)
    result = verify()
    assert not result.ok and f"grant {gid} differs" in result.first_broken.problem
    Grant.objects.filter(pk=gid).update(cap_epsilon=0.5)
    assert verify().ok
    # a record that starts where the last did not leave it (a change in between, unrecorded)
    Dataset.objects.filter(name="clinic").update(budget_epsilon=7.0)
    assert api(officer).patch("/api/datasets/clinic/", {"budget_epsilon": 3.0}, format="json").status_code == 200
    result = verify()
    assert not result.ok and "changes budget_epsilon from 7.0, the record before left it at 2.0" in \
        result.first_broken.problem


def test_a_grant_given_in_the_database_without_a_record_is_found(api, officer, analyst, make_dataset):
    """A probe's INSERT into the grants table gave an analyst a dataset: her releases were
    answered and the chain verified. On a dataset registered since grants are recorded,
    every grant has its record."""
    from governance.models import Grant

    ds = make_dataset(epsilon=1.0)
    assert verify().ok
    g = Grant.objects.create(analyst=analyst, dataset=ds, created_by=officer)
    result = verify()
    assert not result.ok and f"grant {g.pk} has no grant record" in result.first_broken.problem


def test_a_schema_change_is_a_settings_record_and_one_made_in_the_database_is_found(api, officer, make_dataset):
    """The declared bounds and domains set what a release's noise is calibrated to: an
    officer's PATCH of a bound wrote no record (a probe), and a bound edited in the
    database went unnoticed. The schema is recorded by its digest."""
    ds = make_dataset(epsilon=1.0)
    (reg,) = AuditRecord.objects.filter(dataset=ds)
    assert reg.params["schema_sha256"][0] is None and len(reg.params["schema_sha256"][1]) == 64
    r = api(officer).patch("/api/datasets/clinic/", {"schema": {"income": {"lower": 0, "upper": 1}}}, format="json")
    assert r.status_code == 200, r.json()
    (rec,) = _settings()
    assert set(rec.params) == {"schema_sha256"} and rec.params["schema_sha256"][0] == reg.params["schema_sha256"][1]
    assert rec.actor == officer.username and verify().ok
    schema = Dataset.objects.get(pk=ds.pk).schema
    for c in schema["columns"]:
        if c["name"] == "income":
            c["upper"] = 10**9
    Dataset.objects.filter(pk=ds.pk).update(schema=schema)
    result = verify()
    assert not result.ok and "schema_sha256" in result.first_broken.problem


def test_a_bound_past_1e16_hashes_the_same_after_the_databases_round_trip(api, officer, make_dataset, tmp_path):
    """PostgreSQL's jsonb gave a bound of 1e23 back as the int 10**23, where the record had
    hashed the float's own value: the chain failed for good after the PATCH (a probe)."""
    ds = make_dataset(epsilon=1.0)
    for upper in (1e23, 1.2345678901234567e300, 1):
        r = api(officer).patch("/api/datasets/clinic/", {"schema": {"income": {"lower": 0, "upper": upper}}},
                               format="json")
        assert r.status_code == 200, r.json()
        result = verify()
        assert result.ok, result.first_broken.problem
    assert len(_settings()) == 3
    schema = Dataset.objects.get(pk=ds.pk).schema
    assert next(c["upper"] for c in schema["columns"] if c["name"] == "income") == 1
    _exported_and_recomposed(api, officer, tmp_path)


def test_a_grant_moved_to_another_analyst_in_the_database_is_found(officer, analyst, analyst2, make_dataset,
                                                                   grant):
    """A probe's UPDATE gave ann's recorded grant to bob, who spent under it: the grant
    records name the analyst, and the grant must still be hers."""
    from governance.models import Grant

    ds = make_dataset(epsilon=1.0)
    g = grant(analyst, ds)
    assert verify().ok
    Grant.objects.filter(pk=g.pk).update(analyst=analyst2)
    ledger.commit(ledger.admit(ds, analyst2, {"kind": "laplace", "epsilon": 0.5}))
    result = verify()
    assert not result.ok and f"grant {g.pk} differs" in result.first_broken.problem
    assert analyst.username in result.first_broken.problem
