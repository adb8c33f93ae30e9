"""Officers record releases made outside the service: POST /api/datasets/{name}/charges/."""

import pytest

from governance.models import Budget, LedgerEntry

from .conftest import assert_error

pytestmark = pytest.mark.django_db


def url(name="clinic"):
    return f"/api/datasets/{name}/charges/"


def budget(client, name="clinic"):
    return client.get(f"/api/datasets/{name}/").json()["budget"]


@pytest.fixture
def clinic(make_dataset):
    return make_dataset("clinic", epsilon=1.0)


def snapshot(ds):
    return LedgerEntry.objects.count(), Budget.objects.get(pk=ds.pk).state


@pytest.mark.parametrize("policy", ["basic", "advanced", "rdp"])
def test_it_commits_a_charge_and_moves_the_budget(api, officer, make_dataset, policy):
    make_dataset("clinic", policy=policy)
    client = api(officer)
    before = budget(client)
    r = client.post(url(), {"event": {"kind": "laplace", "epsilon": 0.2}, "reference": "table 3 of the report"},
                    format="json")
    assert r.status_code == 201, r.json()
    body = r.json()
    assert (body["status"], body["dataset"], body["analyst"]) == ("committed", "clinic", "olivia")
    assert body["reference"] == "table 3 of the report"
    assert body["event"] == {"kind": "laplace", "epsilon": 0.2}
    assert set(body["charge"]) == {"basic", "advanced", "rdp"}
    assert body["charge"]["basic"]["epsilon"] == pytest.approx(0.2)
    entry = LedgerEntry.objects.get(pk=body["id"])
    assert entry.status == "committed" and entry.committed_at is not None
    after = budget(client)
    assert after["active_entries"] == before["active_entries"] + 1
    for name in ("basic", "advanced", "rdp"):
        assert after["accountants"][name]["epsilon"] > before["accountants"][name]["epsilon"]
        assert after["accountants"][name]["remaining_epsilon"] < before["accountants"][name]["remaining_epsilon"]
    assert after["accountants"]["basic"]["epsilon"] == pytest.approx(0.2)


def test_it_charges_gaussian_and_composed_events(api, officer, clinic):
    client = api(officer)
    events = [
        {"kind": "gaussian", "noise_multiplier": 20.0},
        {"kind": "subsampled_gaussian", "sample_rate": 0.01, "noise_multiplier": 5.0, "steps": 10},
        {"kind": "self_composed", "event": {"kind": "laplace", "epsilon": 0.01}, "count": 3},
        {"kind": "composed", "events": [{"kind": "laplace", "epsilon": 0.01}, {"kind": "no_op"}]},
        {"kind": "epsilon_delta", "epsilon": 0.05, "delta": 0},
        {"kind": "no_op"},
    ]
    for event in events:
        r = client.post(url(), {"event": event}, format="json")
        assert r.status_code == 201, (event, r.json())
        assert r.json()["reference"] == ""
    gaussian = LedgerEntry.objects.order_by("id").first()
    assert gaussian.event["delta"] > 0  # the ledger states the delta it charged at
    assert budget(client)["active_entries"] == len(events)


def test_it_refuses_a_charge_over_budget_with_the_numbers(api, officer, clinic):
    client = api(officer)
    assert client.post(url(), {"event": {"kind": "laplace", "epsilon": 0.7}}, format="json").status_code == 201
    before = snapshot(clinic)
    r = client.post(url(), {"event": {"kind": "laplace", "epsilon": 0.5}, "reference": "too much"}, format="json")
    body = assert_error(r, 409, "budget.exceeded")
    assert body["scope"] == "dataset" and body["policy"] == "rdp"
    assert body["spent_epsilon"] == pytest.approx(0.7, rel=0.05)
    assert body["remaining_epsilon"] == pytest.approx(1.0 - body["spent_epsilon"])
    assert body["would_cost_epsilon"] > body["remaining_epsilon"]
    assert set(body["request_charge"]) == {"basic", "advanced", "rdp"}
    assert body["request_charge"]["basic"]["epsilon"] == pytest.approx(0.5)
    assert snapshot(clinic) == before


def test_it_refuses_a_non_private_release(api, officer, clinic):
    before = snapshot(clinic)
    for event in ({"kind": "non_private"},
                  {"kind": "composed", "events": [{"kind": "laplace", "epsilon": 0.1}, {"kind": "non_private"}]}):
        body = assert_error(api(officer).post(url(), {"event": event}, format="json"), 409, "budget.non_private")
        assert "allow_non_private" in body["detail"]
    assert snapshot(clinic) == before


def test_an_allowed_non_private_release_is_recorded_apart(api, officer, clinic):
    r = api(officer).patch(f"/api/datasets/{clinic.name}/", {"allow_non_private": True}, format="json")
    assert r.status_code == 200, r.content
    assert r.json()["allow_non_private"] is True
    event = {"kind": "composed", "events": [{"kind": "laplace", "epsilon": 0.25}, {"kind": "non_private"}]}
    r = api(officer).post(url(), {"event": event}, format="json")
    assert r.status_code == 201, r.content
    entry = LedgerEntry.objects.get(dataset=clinic)
    assert entry.non_private and entry.event["events"][1] == {"kind": "non_private"}
    budget = api(officer).get(f"/api/datasets/{clinic.name}/").json()["budget"]
    assert budget["non_private_releases"] == 1
    # Only the private part draws on the budget: the ledger stays usable.
    assert budget["accountants"]["basic"]["epsilon"] == pytest.approx(0.25)
    r = api(officer).post(url(), {"event": {"kind": "laplace", "epsilon": 0.25}}, format="json")
    assert r.status_code == 201, r.content


def test_it_refuses_charges_on_a_draft(api, officer, make_dataset):
    ds = make_dataset("clinic", activate=False)
    before = snapshot(ds)
    assert_error(api(officer).post(url(), {"event": {"kind": "laplace", "epsilon": 0.1}}, format="json"),
                 409, "dataset.inactive")
    assert snapshot(ds) == before


@pytest.mark.parametrize("event", [
    {"kind": "cauchy", "epsilon": 0.1},
    {"epsilon": 0.1},
    {"kind": "laplace", "epsilon": "NaN"},
    {"kind": "laplace", "epsilon": "Infinity"},
    {"kind": "laplace", "epsilon": "0.1"},
    {"kind": "laplace", "epsilon": -0.1},
    {"kind": "laplace", "epsilon": 0},
    {"kind": "laplace", "epsilon": True},
    {"kind": "laplace"},
    {"kind": "laplace", "scale": 1.0},
    {"kind": "laplace", "epsilon": 0.1, "scale": 1.0, "sensitivity": 1.0},
    {"kind": "laplace", "epsilon": 0.1, "colour": "red"},
    {"kind": "gaussian"},
    {"kind": "gaussian", "noise_multiplier": 1.0, "delta": 1.5},
    {"kind": "subsampled_gaussian", "sample_rate": 2, "noise_multiplier": 1.0, "steps": 10},
    {"kind": "subsampled_gaussian", "sample_rate": 0.1, "noise_multiplier": 1.0, "steps": 0},
    {"kind": "subsampled_gaussian", "sample_rate": 0.1, "noise_multiplier": 1.0, "steps": 2.5},
    {"kind": "self_composed", "event": {"kind": "laplace", "epsilon": 0.1}},
    {"kind": "self_composed", "event": {"kind": "laplace", "epsilon": 0.1}, "count": 10**12},
    {"kind": "composed", "events": "all of them"},
    {"kind": "composed", "events": [{"kind": "nope"}]},
    {"kind": "epsilon_delta", "epsilon": 0.1, "delta": 1},
    [{"kind": "laplace", "epsilon": 0.1}],
    "laplace",
    7,
])
def test_it_refuses_a_malformed_event_and_writes_nothing(api, officer, clinic, event):
    before = snapshot(clinic)
    assert_error(api(officer).post(url(), {"event": event}, format="json"), 400, "event.invalid")
    assert snapshot(clinic) == before


def test_it_refuses_deeply_nested_events(api, officer, clinic):
    event = {"kind": "laplace", "epsilon": 0.1}
    for _ in range(50):
        event = {"kind": "self_composed", "event": event, "count": 1}
    before = snapshot(clinic)
    assert_error(api(officer).post(url(), {"event": event}, format="json"), 400, "event.invalid")
    assert snapshot(clinic) == before


@pytest.mark.parametrize("data", [{}, {"reference": "no event"}, {"event": None}, {"event": {"kind": "no_op"},
                                                                                  "reference": "x" * 201}])
def test_it_refuses_a_malformed_request_and_writes_nothing(api, officer, clinic, data):
    before = snapshot(clinic)
    assert_error(api(officer).post(url(), data, format="json"), 400)
    assert snapshot(clinic) == before


def test_it_refuses_a_nan_literal(api, officer, clinic):
    before = snapshot(clinic)
    r = api(officer).post(url(), '{"event": {"kind": "laplace", "epsilon": NaN}}', content_type="application/json")
    assert_error(r, 400, "request.malformed")
    assert snapshot(clinic) == before


def test_it_forbids_analysts_to_charge(api, analyst, clinic, grant):
    grant(analyst, clinic)
    before = snapshot(clinic)
    assert_error(api(analyst).post(url(), {"event": {"kind": "laplace", "epsilon": 0.1}}, format="json"),
                 403, "permission.denied")
    assert snapshot(clinic) == before


def test_it_answers_404_for_an_unknown_dataset(api, officer):
    assert_error(api(officer).post(url("nope"), {"event": {"kind": "no_op"}}, format="json"), 404)


def test_it_accepts_the_largest_noise_multiplier_as_almost_free_and_refuses_more(api, officer, make_dataset):
    """Noise of 1e12 times the sensitivity is legitimate (if useless): it must not overflow.
    1e300 was accepted too, and the export's check tool could not recompose the chain
    (z^2 overflows in dp_accounting): past 1e12 it is a 400."""
    ds = make_dataset(epsilon=1.0)
    url = f"/api/datasets/{ds.name}/charges/"
    r = api(officer).post(url, {"event": {"kind": "gaussian", "noise_multiplier": 1e12}}, format="json")
    assert r.status_code == 201, r.content
    assert r.json()["charge"]["rdp"]["epsilon"] < 1e-6
    r = api(officer).post(url, {"event": {"kind": "gaussian", "noise_multiplier": 1e300}}, format="json")
    assert r.status_code == 400 and "noise_multiplier" in r.json()["detail"], r.content


def test_a_charge_named_to_an_analyst_counts_against_her_grant(api, officer, analyst, analyst2, auditor, clinic,
                                                                grant):
    """A probe restored a backup and re-recorded the releases it lost with this endpoint, as
    the restore steps say: each was the officer's, so the analyst's grant forgot them and she
    was given epsilon 1.4 against a cap of 1.0. Named to her, the charge is hers."""
    from governance.models import AuditRecord

    grant(analyst, clinic, cap_epsilon=0.5)
    boss = api(officer)
    r = boss.post(url(), {"event": {"kind": "laplace", "epsilon": 0.4}, "reference": "lost by a restore",
                          "analyst": "ann"}, format="json")
    assert r.status_code == 201, r.json()
    assert (r.json()["analyst"], r.json()["status"]) == ("ann", "committed")
    mine = api(analyst).get("/api/me/").json()["grants"]
    assert [g["spent"]["basic"]["epsilon"] for g in mine] == [pytest.approx(0.4)]
    record = AuditRecord.objects.filter(action="commit").latest("seq")
    assert (record.actor, record.kind, record.detail) == ("ann", "external charge", "recorded by olivia")
    # her cap now refuses what the lost release spent
    assert_error(boss.post(url(), {"event": {"kind": "laplace", "epsilon": 0.2}, "analyst": "ann"}, format="json"),
                 409, "budget.exceeded")
    before = snapshot(clinic)
    assert_error(boss.post(url(), {"event": {"kind": "laplace", "epsilon": 0.05}, "analyst": "bob"}, format="json"),
                 403)  # no grant here
    for name in ("olivia", auditor.username, "nobody"):
        r = boss.post(url(), {"event": {"kind": "laplace", "epsilon": 0.05}, "analyst": name}, format="json")
        assert_error(r, 400)
        assert "no active analyst" in r.json()["errors"]["analyst"][0]
    assert snapshot(clinic) == before


def test_the_charge_command_records_as_the_endpoint_does_without_a_web_service(officer, analyst, clinic, grant):
    """After a restore the lost releases are re-recorded before anyone may ask again: with
    the web service up for that, analysts could ask first (a probe)."""
    from django.core.management import CommandError, call_command

    from governance.audit import verification
    from governance.models import AuditRecord

    grant(analyst, clinic, cap_epsilon=0.5)
    call_command("charge", "clinic", "--event", '{"kind": "laplace", "epsilon": 0.4}', "--officer", "olivia",
                 "--analyst", "ann", "--reference", "  seq 7 of the filed export ")  # trimmed, as the API does
    entry = LedgerEntry.objects.get()
    assert (entry.analyst.username, entry.status, entry.reference) == ("ann", "committed", "seq 7 of the filed export")
    assert AuditRecord.objects.filter(action="commit").latest("seq").detail == "recorded by olivia"
    # a refused one is recorded alike: hers, the officer named, the reference in its own field (a probe: the
    # officer was missing and the reference folded into the detail)
    with pytest.raises(CommandError, match="budget.exceeded"):
        call_command("charge", "clinic", "--event", '{"kind": "laplace", "epsilon": 0.3}', "--officer", "olivia",
                     "--analyst", "ann", "--reference", "seq 8")
    refused = AuditRecord.objects.filter(action="refuse").latest("seq")
    assert (refused.actor, refused.kind, refused.reference) == ("ann", "external charge", "seq 8")
    assert refused.detail.startswith("recorded by olivia: ") and refused.reason == "budget.exceeded"
    before = snapshot(clinic)
    for args, message in [
            (["clinic", "--event", '{"kind": "laplace", "epsilon": 0.2}', "--officer", "olivia", "--analyst", "ann"],
             "budget.exceeded"),  # her cap counts the re-recorded release
            (["clinic", "--event", "{", "--officer", "olivia"], "not JSON"),
            (["clinic", "--event", '{"kind": "laplace", "epsilon": -1}', "--officer", "olivia"], "event"),
            (["clinic", "--event", '{"kind": "no_op"}', "--officer", "ann"], "no active privacy officer"),
            (["clinic", "--event", '{"kind": "no_op"}', "--officer", "olivia", "--analyst", "olivia"],
             "no active analyst"),
            (["nope", "--event", '{"kind": "no_op"}', "--officer", "olivia"], "no dataset named")]:
        with pytest.raises(CommandError, match=message):
            call_command("charge", *args)
    assert snapshot(clinic)[1] == before[1]
    assert verification.verify().ok
