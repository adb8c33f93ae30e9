"""The RDP filter's delta share for approximate-DP events is a per-dataset setting
(Dataset.approx_delta_share, default 0.1): the gate reads it, it is fixed once the
ledger has entries, and each dataset shows what its filter charges above plain
composition."""

import math

import pytest

from accounting import rdp
from accounting.costs import Cost, cost_of
from accounting.events import parse_event
from governance.datasets import registry as datasets
from governance.ledger import actions as ledger, limits
from governance.core.errors import BudgetExceeded, InvalidDataset
from governance.models import Budget

pytestmark = pytest.mark.django_db


def approx_event(ds, fraction):
    """An (epsilon, delta) release using ``fraction`` of the dataset's delta."""
    return {"kind": "epsilon_delta", "epsilon": 0.01, "delta": fraction * ds.budget_delta}


def test_the_default_share_is_the_module_default(make_dataset):
    ds = make_dataset()
    assert ds.approx_delta_share == rdp.APPROX_SHARE == 0.1
    assert ledger.Limit.of_dataset(ds).approx_share == 0.1


def test_the_gate_reads_the_datasets_share(make_dataset, officer):
    ds = make_dataset(delta=1e-6)
    with pytest.raises(BudgetExceeded):  # 30% of delta: above the default 10%
        ledger.admit(ds, officer, approx_event(ds, 0.3))
    ds = make_dataset("wide", delta=1e-6)
    ds = datasets.update(ds, approx_delta_share=0.5)
    entry = ledger.admit(ds, officer, approx_event(ds, 0.3))
    assert entry.status == "reserved"
    ds = make_dataset("none", delta=1e-6)
    ds = datasets.update(ds, approx_delta_share=0.0)
    with pytest.raises(BudgetExceeded):
        ledger.admit(ds, officer, approx_event(ds, 1e-3))
    assert ledger.admit(ds, officer, {"kind": "laplace", "epsilon": 0.1}).status == "reserved"


def test_a_larger_share_makes_other_requests_dearer():
    cost = cost_of(parse_event({"kind": "gaussian", "noise_multiplier": 4.0, "delta": 1e-7}))
    at = [rdp.filter_epsilon(cost, 1e-5, s) for s in (0.0, 0.1, 0.5, 0.9)]
    assert at == sorted(at) and at[0] < at[-1]
    assert rdp.filter_epsilon(cost, 1e-5) == rdp.filter_epsilon(cost, 1e-5, 0.1)


def test_the_share_is_fixed_once_the_ledger_has_entries(make_dataset, officer):
    ds = make_dataset()
    ds = datasets.update(ds, approx_delta_share=0.2)  # no entries yet: allowed
    assert ds.approx_delta_share == 0.2
    ledger.admit(ds, officer, {"kind": "laplace", "epsilon": 0.1})
    with pytest.raises(InvalidDataset, match="fixed"):
        datasets.update(ds, approx_delta_share=0.3)
    for bad in (-0.1, 0.95, math.nan):
        with pytest.raises(InvalidDataset):
            datasets.update(make_dataset(f"d{abs(hash(bad)) % 1000}"), approx_delta_share=bad)


def test_each_dataset_shows_the_price_of_its_filter(make_dataset, officer):
    ds = make_dataset(epsilon=10.0)
    ledger.admit(ds, officer, {"kind": "subsampled_gaussian", "sample_rate": 0.01, "noise_multiplier": 1.1,
                               "steps": 1000})
    report = limits.budget_report(Cost.from_json(Budget.objects.get(pk=ds.pk).state), ledger.Limit.of_dataset(ds))
    r = report["rdp"]
    assert r["filter_price_epsilon"] == pytest.approx(r["filter_epsilon"] - r["epsilon"])
    assert r["filter_price_epsilon"] > 0  # the union bound over orders costs something


def test_the_api_shows_and_patches_the_share(make_dataset, officer, api):
    ds = make_dataset()
    client = api(officer)
    r = client.get(f"/api/datasets/{ds.name}/")
    assert r.status_code == 200 and r.json()["approx_delta_share"] == 0.1
    assert "filter_price_epsilon" in r.json()["budget"]["accountants"]["rdp"]
    r = client.patch(f"/api/datasets/{ds.name}/", {"approx_delta_share": 0.25}, format="json")
    assert r.status_code == 200 and r.json()["approx_delta_share"] == 0.25
    r = client.patch(f"/api/datasets/{ds.name}/", {"approx_delta_share": 2}, format="json")
    assert r.status_code == 400 and "approx_delta_share" in r.text
