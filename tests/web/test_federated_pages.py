"""The officer's pages for a federated dataset (issue 27): its sites with their row counts
and when each was handed its secret (never the secret), and a federated run's progress per
round (epsilon so far, the DP evaluation with its interval) in the request lists."""

import pytest

from governance.datasets import registry
from governance.datasets.federated import site_secret
from governance.models import Request

pytestmark = pytest.mark.django_db

SCHEMA = [{"name": "x", "type": "numeric", "lower": 0, "upper": 1},
          {"name": "label", "type": "categorical", "domain": ["no", "yes"]}]
PROGRESS = {"phase": "training", "fraction": 0.4, "round": 2, "rounds": 5, "epsilon_spent": 0.8123,
            "sites": {"sampled": ["h1", "h2"], "accepted": ["h1", "h2"], "rejected": {}},
            "history": [{"round": 1, "epsilon_spent": 0.5},
                        {"round": 2, "epsilon_spent": 0.8123, "accuracy": 0.7312, "accuracy_ci95": [0.7, 0.76]}]}


@pytest.fixture
def wards(officer, analyst):
    ds = registry.register(name="wards", created_by=officer, schema=SCHEMA, budget_epsilon=3.0, activate=True,
                           execution="federated", sites=[{"site": "h1", "n_rows": 120}, {"site": "h2", "n_rows": 80}])
    Request.objects.create(analyst=analyst, dataset=ds, engine="federated", kind="train", params={}, fingerprint="f",
                           plan={"event": None, "columns": [], "details": {}}, status="running", progress=PROGRESS)
    return ds


def test_the_dataset_page_lists_the_sites_and_a_runs_rounds(client, officer, wards):
    client.force_login(officer)
    html = client.get(f"/admin/governance/dataset/{wards.pk}/overview/").content.decode()
    assert 'id="sites"' in html and "<td>h1</td><td>120</td><td>never</td>" in html
    assert "round 2/5, epsilon 0.812, 2 site(s) aggregated, DP accuracy 0.731 (95% 0.700-0.760)" in html
    assert site_secret("wards", "h1") not in html
    html = client.get("/admin/governance/request/").content.decode()
    assert "round 2/5, epsilon 0.812" in html
    assert client.get(f"/admin/governance/dataset/{wards.pk}/change/").status_code == 200


def test_a_dataset_that_is_not_federated_has_no_sites_section(client, officer, make_dataset):
    client.force_login(officer)
    ds = make_dataset("plain")
    assert 'id="sites"' not in client.get(f"/admin/governance/dataset/{ds.pk}/overview/").content.decode()


def test_a_site_key_record_shows_on_the_officers_and_the_auditors_pages(client, officer, wards, django_user_model):
    from django.contrib.auth.models import Group

    from governance.datasets.federated import issue_secret

    issue_secret(wards, "h2", officer.username)
    client.force_login(officer)
    html = client.get(f"/admin/governance/dataset/{wards.pk}/overview/").content.decode()
    assert "site_key" in html and "h2" in html
    auditor = django_user_model.objects.create_user("audrey")
    auditor.groups.add(Group.objects.get_or_create(name="auditors")[0])
    client.force_login(auditor)
    for url in ("/auditor/datasets/wards/", "/auditor/datasets/wards/?action=site_key", "/auditor/verify/"):
        r = client.get(url)
        assert r.status_code == 200, url
    assert "site_key" in client.get("/auditor/datasets/wards/?action=site_key").content.decode()
    r = client.get("/auditor/export/?dataset=wards&format=pdf")
    assert r.status_code == 200
