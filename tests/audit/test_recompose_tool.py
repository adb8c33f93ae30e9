"""tools/recompose_audit.py: the third party's independent check of a JSON audit export.

A real history is written through the service's own ledger and audit functions, exported
with ``audit_export``, and the tool is run on the file as a separate process (as an
outsider would run it). An intact export passes; an edited event, a deleted record, an
edited total, a re-hashed forgery and an exceeded cap are each found and named.
"""

import ast
import contextlib
import functools
import hashlib
import io
import importlib.util
import json
import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from django.conf import settings
from django.db import transaction

from governance.ledger import trail, actions as ledger
from governance.audit import export as audit_export
from governance.datasets import registry as datasets
from governance.models import Grant
from governance.requests.submission import GATE_REFUSALS

ROOT = Path(__file__).resolve().parents[2]
TOOL = ROOT / "tools" / "recompose_audit.py"

SUBSAMPLED = {"kind": "subsampled_gaussian", "sample_rate": 0.01, "noise_multiplier": 1.1, "steps": 300}
EVENTS = [
    {"kind": "laplace", "epsilon": 0.1},
    {"kind": "gaussian", "noise_multiplier": 5.0},
    SUBSAMPLED,
    {"kind": "composed", "events": [{"kind": "laplace", "epsilon": 0.05},
                                    {"kind": "gaussian", "noise_multiplier": 8.0}]},
    {"kind": "self_composed", "event": {"kind": "laplace", "epsilon": 0.02}, "count": 5},
    {"kind": "epsilon_delta", "epsilon": 0.1, "delta": 1e-9},
    {"kind": "laplace", "scale": 20.0, "sensitivity": 1.0},
    {"kind": "self_composed", "event": {"kind": "gaussian", "noise_multiplier": 12.0}, "count": 4},
    {"kind": "epsilon_delta", "epsilon": 0.05, "delta": 0.0},
    {"kind": "self_composed", "count": 2, "event": {"kind": "composed", "events": [
        {"kind": "gaussian", "noise_multiplier": 20.0}, {"kind": "laplace", "epsilon": 0.01}]}},
]
NON_PRIVATE = {"kind": "composed", "events": [{"kind": "laplace", "epsilon": 0.02}, {"kind": "non_private"}]}


def ctx(**kw):
    return trail.Context(engine="aggregates", kind="count", params={"column": "age", "note": "ü<b>&"}, **kw)


def register(officer, name, policy, epsilon=3.0):
    rng = np.random.default_rng(0)
    path = Path(settings.DATASET_IMPORT_DIRS[0]) / f"{name}.csv"
    lines = ["age,income"] + [f"{a},{i}" for a, i in zip(rng.integers(18, 90, 300), rng.integers(0, 5000, 300))]
    path.write_text("\n".join(lines) + "\n")
    return datasets.register(name=name, created_by=officer, path=str(path), budget_epsilon=epsilon,
                             budget_delta="auto", policy=policy, activate=True,
                             schema={"age": {"lower": 0, "upper": 90}, "income": {"lower": 0, "upper": 5000}})


def build_history(ds, analysts, n=40, non_private=False):
    """n requests over EVENTS and analysts: every 5th refunded, DP-SGD committed with fewer
    steps, one replay and (optionally) one non-private baseline; refused once over budget."""
    counts = {"commit": 0, "release": 0, "refuse": 0, "replay": 0}
    for i in range(n):
        who, event = analysts[i % len(analysts)], EVENTS[i % len(EVENTS)]
        if non_private and i == 3:
            event = NON_PRIVATE
        try:
            entry = ledger.admit(ds, who, event, reference=f"request {i}")
        except GATE_REFUSALS as err:
            trail.record_refusal(ds, who, event, err, ctx())
            counts["refuse"] += 1
            continue
        if i % 5 == 4:
            ledger.release(entry, audit_ctx=ctx(outcome="failed", reason="request.failed_before_read"))
            counts["release"] += 1
        elif event is SUBSAMPLED:
            ledger.commit(entry, {**SUBSAMPLED, "steps": 120}, audit_ctx=ctx(outcome="cancelled", worker="gpu@a"))
            counts["commit"] += 1
        else:
            ledger.commit(entry, audit_ctx=ctx(outcome="succeeded", result_sha256="ab" * 32, worker="cpu@a"))
            counts["commit"] += 1
        if i == 6:
            with transaction.atomic():
                trail.record_replay(ds, who, ctx())
            counts["replay"] += 1
    return counts


@pytest.fixture
def histories(officer, analyst, analyst2):
    """Three datasets, one per policy, each with its own history."""
    out = {}
    for policy in ("rdp", "basic", "advanced"):
        ds = register(officer, f"survey-{policy}", policy)
        if policy == "rdp":
            from governance.datasets.registry import update

            ds = update(ds, allow_non_private=True, actor=officer.username)  # a settings record
        Grant.objects.create(analyst=analyst, dataset=ds, created_by=officer, cap_epsilon=2.0)
        Grant.objects.create(analyst=analyst2, dataset=ds, created_by=officer)
        counts = build_history(ds, [analyst, analyst2], non_private=policy == "rdp")
        assert counts["refuse"] > 0 and counts["release"] > 0 and counts["commit"] > 8, (policy, counts)
        out[policy] = ds
    return out


@pytest.fixture
def export_file(histories, tmp_path):
    export = audit_export.build(list(histories.values()))
    path = tmp_path / "export.json"
    path.write_bytes(audit_export.to_json(export))
    return path


def run(path, *args, isolated=False):
    """(exit status, stdout, stderr) of the tool on ``path``: ``isolated`` as an outsider
    runs it, a process of its own in isolated mode (-I: nothing from this project's
    directory or PYTHONPATH is importable); otherwise its ``main`` in this process (each
    process spent about 2.3 s importing dp_accounting, a minute of this file's test time;
    that it imports nothing from the service is test_the_tool_imports_nothing_from_the_service's)."""
    if isolated:
        p = subprocess.run([sys.executable, "-I", str(TOOL), str(path), *args], capture_output=True, text=True,
                           timeout=600, cwd=path.parent, check=False)
        return p.returncode, p.stdout, p.stderr
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = _in_process().main([str(path), *args])
    return code, out.getvalue(), err.getvalue()


@functools.cache
def _in_process():
    spec = importlib.util.spec_from_file_location("recompose_audit_in_process", TOOL)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def load(path):
    return json.loads(path.read_text(encoding="utf-8"))


def save(path, export):
    path.write_bytes(json.dumps(export, indent=1, ensure_ascii=False).encode())


def rehash(ds):
    """What a forger with write access would do: re-link and re-hash the whole chain."""
    prev = "0" * 64
    for rec in ds["records"]:
        rec["prev_hash"] = prev
        body = {k: v for k, v in rec.items() if k != "hash"}
        rec["hash"] = prev = hashlib.sha256(json.dumps(body, sort_keys=True, separators=(",", ":"),
                                                       ensure_ascii=False).encode()).hexdigest()
    ds["head"] = {"seq": len(ds["records"]), "hash": prev}


def dataset(export, policy):
    return next(d for d in export["datasets"] if d["name"] == f"survey-{policy}")


def laplace_commit(ds, after=2):
    return next(r for r in ds["records"] if r["action"] == "commit" and r["seq"] > after
                and r["event"] == {"kind": "laplace", "epsilon": 0.1})


# --------------------------------------------------------------------------- intact


@pytest.mark.django_db
def test_an_intact_export_passes(export_file):
    code, out, err = run(export_file, isolated=True)
    assert code == 0, out + err
    assert "RESULT: ok" in out
    for policy in ("rdp", "basic", "advanced"):
        assert f"dataset survey-{policy}:" in out
        assert f"cap ({policy} policy" in out
    assert "chain: BROKEN" not in out and "PROBLEM" not in out


@pytest.mark.django_db
def test_the_history_covers_every_event_kind_and_action(export_file):
    export = load(export_file)
    kinds, actions = set(), set()

    def walk(e):
        kinds.add(e["kind"])
        for sub in e.get("events", []) + ([e["event"]] if "event" in e else []):
            walk(sub)

    for ds in export["datasets"]:
        for r in ds["records"]:
            actions.add(r["action"])
            if r["action"] == "commit":
                walk(r["event"])
    assert kinds >= {"laplace", "gaussian", "subsampled_gaussian", "composed", "self_composed", "epsilon_delta",
                     "non_private"}
    assert actions == {"settings", "commit", "release", "refuse", "replay"}  # settings: each registration
    smaller = [r for ds in export["datasets"] for r in ds["records"] if r["reserved_event"]]
    assert smaller and all(r["event"]["steps"] == 120 and r["reserved_event"]["steps"] == 300 for r in smaller)
    assert {d["budget"]["policy"] for d in export["datasets"]} == {"rdp", "basic", "advanced"}


@pytest.mark.django_db
def test_json_result_agrees_with_the_service_to_high_precision(export_file):
    code, out, _ = run(export_file, "--json")
    assert code == 0
    result = json.loads(out)
    assert result["ok"] is True and len(result["datasets"]) == 3
    for ds in result["datasets"]:
        assert ds["ok"] and ds["chain_ok"] and ds["first_broken_record"] is None
        assert ds["records_compared"] == ds["records"] > 20
        assert ds["counts"]["commit"] > 8
        # measured: ~1e-12 (analytic Gaussian root finding); the default tolerance is 1e-6
        assert all(d < 1e-9 for d in ds["max_rel_diff"].values()), ds["max_rel_diff"]
        for acc in ("basic", "advanced", "rdp"):
            f = ds["final"][acc]
            assert f["epsilon"] == pytest.approx(f["exported_epsilon"], rel=1e-9)
        cap = ds["cap"]
        assert cap["filter_ok"] and cap["plain_ok"] and cap["plain_epsilon"] <= cap["epsilon"]
        if cap["policy"] == "basic":
            assert cap["filter_epsilon"] == pytest.approx(cap["plain_epsilon"], rel=1e-9)
    rdp = next(d for d in result["datasets"] if d["cap"]["policy"] == "rdp")
    assert rdp["counts"]["non_private"] == 1


# --------------------------------------------------------------------------- tampering


@pytest.mark.django_db
def test_an_edited_epsilon_is_found_and_named(export_file):
    export = load(export_file)
    rec = laplace_commit(dataset(export, "rdp"))
    rec["event"]["epsilon"] = 0.01
    save(export_file, export)
    code, out, _ = run(export_file)
    assert code == 1 and "RESULT: FAILED" in out
    assert f"first broken at record {rec['seq']}" in out
    assert f"record {rec['seq']}: its hash does not match its content" in out
    assert f"record {rec['seq']}: its charge: basic epsilon is 0.1, re-composed 0.01" in out
    assert "dataset survey-basic:" in out and out.count("result: ok") == 2  # the other datasets are fine


@pytest.mark.django_db
@pytest.mark.parametrize("policy", ["rdp", "basic"])
def test_a_deleted_record_is_found_and_named(export_file, policy):
    export = load(export_file)
    ds = dataset(export, policy)
    rec = laplace_commit(ds)
    ds["records"].remove(rec)
    save(export_file, export)
    code, out, _ = run(export_file, "--json")
    assert code == 1
    res = next(d for d in json.loads(out)["datasets"] if d["name"] == ds["name"])
    assert not res["ok"] and res["first_broken_record"] == rec["seq"] + 1
    problems = [p for p in res["problems"] if p["seq"] == rec["seq"] + 1]
    assert any("out of sequence" in p["message"] for p in problems)
    assert any("prev_hash" in p["message"] for p in problems)
    # the totals of the next records no longer re-compose either
    assert any(p["check"] == "recompose" and p["seq"] == rec["seq"] + 1 for p in res["problems"])


@pytest.mark.django_db
def test_a_deleted_last_record_is_found(export_file):
    export = load(export_file)
    ds = dataset(export, "basic")
    ds["records"].pop()
    save(export_file, export)
    code, out, _ = run(export_file)
    assert code == 1 and "the head says" in out and "deleted or added at the end" in out


@pytest.mark.django_db
def test_a_head_that_is_not_an_object_is_named(export_file):
    """Was "could not be checked: AttributeError: 'str' object has no attribute 'get'"."""
    export = load(export_file)
    dataset(export, "basic")["head"] = "abc"
    save(export_file, export)
    code, out, _ = run(export_file)
    assert code == 1 and "head is a str, not an object with seq and hash" in out and "AttributeError" not in out


@pytest.mark.django_db
@pytest.mark.parametrize("policy,accountant", [("rdp", "rdp"), ("basic", "basic"), ("rdp", "advanced")])
def test_an_edited_total_is_found_and_named(export_file, policy, accountant):
    export = load(export_file)
    ds = dataset(export, policy)
    rec = ds["records"][len(ds["records"]) // 2]
    rec["totals"][accountant]["epsilon"] *= 0.5
    save(export_file, export)
    code, out, _ = run(export_file)
    assert code == 1
    assert f"first broken at record {rec['seq']}" in out
    assert f"record {rec['seq']}: its totals: {accountant} epsilon is" in out
    assert "the export states less (under-charged)" in out


@pytest.mark.django_db
@pytest.mark.parametrize("policy", ["rdp", "basic"])
def test_a_rehashed_forgery_is_caught_by_the_recomposition(export_file, policy):
    """Someone who can rewrite the whole chain (and the head) keeps the hashes consistent;
    the events no longer compose to the totals they carry."""
    export = load(export_file)
    ds = dataset(export, policy)
    rec = laplace_commit(ds)
    rec["event"]["epsilon"] = 0.001
    rehash(ds)
    save(export_file, export)
    code, out, _ = run(export_file, isolated=policy == "rdp")
    assert code == 1
    assert "chain: ok" in out  # the forger kept the chain consistent ...
    assert f"record {rec['seq']}: its totals: basic epsilon is" in out  # ... not the arithmetic


@pytest.mark.django_db
def test_a_rehashed_smaller_subsampled_gaussian_is_caught(export_file):
    export = load(export_file)
    ds = dataset(export, "rdp")
    rec = next(r for r in ds["records"] if r["action"] == "commit" and r["reserved_event"])
    rec["event"]["steps"] = 60
    rehash(ds)
    save(export_file, export)
    code, out, _ = run(export_file)
    assert code == 1 and f"record {rec['seq']}: its totals: rdp epsilon is" in out


@pytest.mark.django_db
def test_a_spend_over_the_cap_is_reported(export_file):
    """An export whose budget is below what was spent fails the cap check (the chain itself
    is intact), and the check of the budget against the last settings record."""
    export = load(export_file)
    ds = dataset(export, "rdp")
    ds["budget"]["epsilon"] = ds["totals"]["rdp"]["epsilon"] / 2
    save(export_file, export)
    code, out, _ = run(export_file, "--json")
    assert code == 1
    res = next(d for d in json.loads(out)["datasets"] if d["name"] == ds["name"])
    assert res["chain_ok"] and not res["cap"]["filter_ok"] and not res["cap"]["plain_ok"]
    # and the budget no longer matches what the registration's settings record set
    assert {p["check"] for p in res["problems"]} == {"cap", "settings"}


@pytest.mark.django_db
def test_tolerance_is_honoured(export_file):
    export = load(export_file)
    ds = dataset(export, "basic")
    rec = ds["records"][-1]
    rec["totals"]["basic"]["epsilon"] *= 1 + 1e-4
    rehash(ds)
    save(export_file, export)
    assert run(export_file)[0] == 1
    assert run(export_file, "--tolerance", "1e-3")[0] == 0


def test_an_unreadable_file_fails(tmp_path):
    path = tmp_path / "broken.json"
    path.write_text("{not json")
    code, out, _ = run(path)
    assert code == 1 and "cannot read" in out


# --------------------------------------------------------------------------- the tool itself


def test_the_tool_imports_nothing_from_the_service():
    tree = ast.parse(TOOL.read_text())
    modules = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            modules |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            assert node.level == 0
            modules.add(node.module.split(".")[0])
    assert modules <= set(sys.stdlib_module_names) | {"numpy", "scipy", "dp_accounting"}, modules


@pytest.fixture(scope="module")
def tool():
    return _in_process()


def _integrated_rdp(q, sigma, alpha):
    """RDP of one Poisson-subsampled Gaussian step by numerical integration of its definition."""
    from scipy import integrate, stats

    def f(z):
        log_ratio = np.logaddexp(math.log1p(-q), math.log(q) + (2 * z - 1) / (2 * sigma * sigma))
        return math.exp(stats.norm.logpdf(z, 0, sigma) + alpha * log_ratio)

    a = integrate.quad(f, -60 * sigma, 60 * sigma + 10, epsabs=0, epsrel=1e-12, limit=1000, points=[0, 0.5, 1])[0]
    return math.log(a) / (alpha - 1)


@pytest.mark.parametrize("q,sigma,alpha", [(0.01, 1.1, 1.5), (0.01, 1.1, 2.75), (0.2, 1.1, 2.75),
                                           (0.05, 0.8, 2.5), (0.3, 2.0, 1.75), (0.001, 0.7, 4.5)])
def test_fractional_orders_match_numerical_integration(tool, q, sigma, alpha):
    assert tool.log_a_fractional(q, sigma, alpha) / (alpha - 1) == pytest.approx(
        _integrated_rdp(q, sigma, alpha), rel=1e-8)


@pytest.mark.parametrize("q,sigma,alpha", [(0.01, 1.1, 3), (0.2, 0.9, 8)])
def test_the_fractional_series_agrees_with_dp_accounting_at_integer_orders(tool, q, sigma, alpha):
    from dp_accounting.rdp import rdp_privacy_accountant as rdp

    assert tool.log_a_fractional(q, sigma, float(alpha)) == pytest.approx(
        rdp._compute_log_a_int(q, sigma, alpha), rel=1e-10)


@pytest.mark.parametrize("z,delta", [(0.5, 1e-5), (1.0, 1e-6), (5.0, 6e-8), (8.0, 2.5e-16), (50.0, 1e-3)])
def test_analytic_gaussian_epsilon_solves_balle_wang(tool, z, delta):
    from scipy.stats import norm

    eps = tool.gaussian_epsilon(z, delta)
    got = norm.cdf(1 / (2 * z) - eps * z) - math.exp(eps) * norm.cdf(-1 / (2 * z) - eps * z)
    assert got <= delta * (1 + 1e-9) and got == pytest.approx(delta, rel=1e-6, abs=0 if eps > 0 else delta)


def test_randomized_response_curve_is_the_pure_dp_bound(tool):
    orders = tool.Orders(tool.SERVICE_ORDERS)
    eps = 0.3
    a = orders.finite
    expected = (np.logaddexp(a * eps, (1 - a) * eps) - np.logaddexp(0.0, eps)) / (a - 1)
    np.testing.assert_allclose(orders._curve(("pure", eps)), np.minimum(expected, eps), rtol=1e-9)
    assert np.all(orders._curve(("pure", eps)) <= np.minimum(eps, a * eps * eps / 2) * (1 + 1e-12))


def test_an_export_without_records_is_reported(tool):
    result = tool.check_export({"format": "privacy-audit/1", "hashing": {"algorithm": "sha256", "genesis": "0" * 64},
                                "datasets": [{"name": "x", "head": {"seq": 0, "hash": "0" * 64}}]}, 1e-6)
    assert not result["ok"] and "no records list" in json.dumps(result)


def test_conversion_is_balle_et_al_without_the_kl_shortcut(tool):
    """Thm. 21 at every order > 1.01, also where dp_accounting would answer 0 from its KL bound."""
    orders = tool.Orders(tool.SERVICE_ORDERS)
    a = orders.finite
    for curve, delta in [(a / (2 * 4.0 ** 2), 1e-5), (1e-9 * a, 1e-3), (3e-7 * a, 1e-3)]:
        use = a > 1.01
        expected = np.min(curve[use] + np.log1p(-1 / a[use]) - np.log(delta * a[use]) / (a[use] - 1))
        assert orders.to_epsilon(curve, delta) == pytest.approx(max(expected, 0.0), rel=1e-12)


# --------------------------------------------------------------------------- the RDP filter (issue 16)


@pytest.mark.django_db
def test_the_rdp_filter_is_re_composed_with_the_datasets_delta_share(export_file):
    code, out, _ = run(export_file, "--json")
    cap = next(d for d in json.loads(out)["datasets"] if d["cap"]["policy"] == "rdp")["cap"]
    assert code == 0 and cap["approx_delta_share"] == 0.1
    assert cap["filter_recomposed"] == pytest.approx(cap["filter_epsilon"], rel=1e-9)
    assert cap["filter_recomposed"] > cap["plain_epsilon"]  # the union bound over orders costs something


@pytest.mark.django_db
def test_an_edited_delta_share_or_filter_is_found(export_file):
    export = load(export_file)
    ds = dataset(export, "rdp")
    ds["budget"]["approx_delta_share"] = 0.5  # the filter was exported at 0.1
    save(export_file, export)
    code, out, _ = run(export_file)
    assert code == 1 and "differs from the one re-composed here" in out and "delta share 0.5" in out

    export = load(export_file)
    ds = dataset(export, "rdp")
    ds["budget"]["approx_delta_share"] = 0.1
    ds["spent_filter"]["rdp"] = ds["spent_filter"]["rdp"] * 0.9  # a filter made to look cheaper
    save(export_file, export)
    code, out, _ = run(export_file)
    assert code == 1 and "differs from the one re-composed here" in out


@pytest.mark.django_db
def test_an_export_without_the_share_is_read_at_the_old_constant(export_file):
    export = load(export_file)
    del dataset(export, "rdp")["budget"]["approx_delta_share"]
    save(export_file, export)
    code, out, _ = run(export_file)
    assert code == 0, out


# --------------------------------------------------------------------------- issue 16: the refined total
# (one end-to-end run of the script each; the edits are checked in-process, ``tool.check_export``)


def messages(result, name):
    ds = next(d for d in result["datasets"] if d["name"] == name)
    return [p["message"] for p in ds["problems"]], ds["notes"]


@pytest.mark.django_db
def test_the_refined_total_and_each_commits_charge_are_re_derived(export_file):
    code, out, _ = run(export_file, "--json")
    assert code == 0, out
    for ds in json.loads(out)["datasets"]:
        ref = ds["refined"]
        assert ref["recomputed"] == pytest.approx(ref["epsilon"], rel=1e-9)
        assert ref["epsilon"] <= ref["grid_epsilon"]
    got = next(d for d in json.loads(out)["datasets"] if d["name"] == "survey-rdp")["refined"]
    assert got["epsilon"] < got["grid_epsilon"]  # off the grid: tighter here
    ds = dataset(load(export_file), "rdp")
    commits = {r["seq"]: r for r in ds["records"] if r["action"] == "commit"}
    charges = ds["refined"]["charges"]
    assert [c["seq"] for c in charges] == list(commits) and got["charges"] == len(charges)
    assert all(c["epsilon"] <= commits[c["seq"]]["charge"]["rdp"]["epsilon"] for c in charges)
    assert any(c["epsilon"] < 0.99 * commits[c["seq"]]["charge"]["rdp"]["epsilon"] for c in charges)


@pytest.mark.django_db
def test_an_edited_refined_figure_is_found(export_file, tool):
    def edited(edit, charge=False):
        export = load(export_file)
        ref = dataset(export, "rdp")["refined"]
        edit(next(c for c in ref["charges"] if c["order"] is not None) if charge else ref["rdp"])
        return messages(tool.check_export(export, 1e-6), "survey-rdp")[0]

    not_at_order = "is not the conversion at that order"
    assert any(not_at_order in m for m in edited(lambda r: r.update(epsilon=r["epsilon"] * 0.99)))
    assert any(not_at_order in m for m in edited(lambda r: r.update(order=r["order"] * 1.5)))
    assert any("above the grid" in m for m in edited(lambda r: r.update(epsilon="inf")))
    found = edited(lambda r: r.update(epsilon=r["epsilon"] * 0.95), charge=True)
    assert len(found) == 1 and found[0].startswith("its refined rdp charge")
    export = load(export_file)
    for ds in export["datasets"]:
        del ds["refined"]
    problems, notes = messages(tool.check_export(export, 1e-6), "survey-rdp")
    assert not problems and any("no refined rdp total in the export" in n for n in notes)  # an older export


# --------------------------------------------------------------------------- issue 16: a PLD-certified synthesis


@pytest.fixture
def pld_export(officer, analyst, tmp_path):
    """An MST run planned under PLD (the real planner), charged and audited as the worker
    would, then exported."""
    from engines import plugins
    from engines.types import DatasetMeta, EngineRequest

    ds = register(officer, "synth", "rdp", epsilon=10.0)
    Grant.objects.create(analyst=analyst, dataset=ds, created_by=officer)
    meta = DatasetMeta("synth", {"age": {"type": "numeric", "lower": 0, "upper": 90},
                                 "income": {"type": "numeric", "lower": 0, "upper": 5000}},
                       None, 300_000, 300_000, ds.budget_delta, allow_pld=True)
    params = {"epsilon": 2.0, "accountant": "pld"}
    plan = plugins.plan("synthesis", EngineRequest("synthesize", params), meta)
    assert plan.details["certified_by"] == "pld" and plan.details["planned_epsilon"] > 2.0
    entry = ledger.admit(ds, analyst, plan.event, reference="mst")
    ledger.commit(entry, audit_ctx=trail.Context(engine="synthesis", kind="synthesize", params=params,
                                                 outcome="succeeded"))
    path = tmp_path / "pld.json"
    path.write_bytes(audit_export.to_json(audit_export.build([ds])))
    return path


@pytest.mark.django_db
def test_a_pld_certified_synthesis_is_re_certified_and_a_false_one_found(pld_export, tool):
    code, text, _ = run(pld_export)
    assert code == 0, text
    assert "PLD-certified synthesis, re-certified here" in text
    export = load(pld_export)
    (cert,) = tool.check_export(export, 1e-6)["datasets"][0]["pld_certified"]
    assert cert["target"] == 2.0 and 2.0 * (1 - 5e-3) < cert["pld_epsilon"] <= 2.0
    ds = export["datasets"][0]
    rec = next(r for r in ds["records"] if r["action"] == "commit")
    rec["params"]["epsilon"] = 1.9  # a certificate claimed for less than the noise gives
    rehash(ds)
    problems, _ = messages(tool.check_export(export, 1e-6), "synth")
    assert any("above the target 1.9 it was certified at" in m for m in problems)


@pytest.mark.django_db
def test_an_export_with_a_tiny_sampling_rate_passes(officer, tmp_path):
    """A probe's officer charges (the events a VAE and a batch-size-1 DP-SGD run commit,
    q = 1/2400): the tool found the refined total 1.72889 at order 8.71 "not the conversion
    at that order" (1.72801): the service bounds that fractional order by the chord of its
    integer neighbours (Opacus's series keeps no digits there), 0.05% above, valid."""
    from governance.ledger import actions as ledger

    ds = register(officer, "tinyq", "rdp", epsilon=10.0)
    vae = {"kind": "subsampled_gaussian", "sample_rate": 0.21333333333333335, "noise_multiplier": 2.3393454075309505,
           "steps": 5}
    for event in (vae, {"kind": "composed", "events": [
            {"kind": "subsampled_gaussian", "sample_rate": 1 / 2400, "noise_multiplier": 2.606268121585188,
             "steps": 2400000},
            {"kind": "self_composed", "event": {"kind": "laplace", "epsilon": 0.00012512512512512512}, "count": 999},
            {"kind": "laplace", "epsilon": 0.125}]}, vae, {"kind": "composed", "events": [
            {"kind": "subsampled_gaussian", "sample_rate": 1 / 2400, "noise_multiplier": 4.727956868181842,
             "steps": 197},
            {"kind": "laplace", "epsilon": 6.256256256256256e-05}, {"kind": "laplace", "epsilon": 0.0625}]}):
        ledger.charge(ds, officer, event)
    path = tmp_path / "export.json"
    path.write_bytes(audit_export.to_json(audit_export.build([ds])))
    code, out, _ = run(path)
    assert code == 0, out


def test_an_export_with_a_subnormal_sampling_rate_passes(officer, tmp_path, api):
    """1/q past a float's range: the tool's series took q = 5e-324 for no subsampling at all
    (743 per step at order 1,487) and failed an honest trail at delta 1e-320 (probe CR)."""
    from governance.ledger import actions as ledger

    ds = register(officer, "subq", "rdp", epsilon=10.0)
    ledger.charge(ds, officer, {"kind": "subsampled_gaussian", "sample_rate": 5e-324, "noise_multiplier": 1.0,
                                "steps": 1_000_000})
    r = api(officer).patch("/api/datasets/subq/", {"budget_delta": 1e-320}, format="json")
    assert r.status_code == 200, r.content
    ds.refresh_from_db()
    path = tmp_path / "export.json"
    path.write_bytes(audit_export.to_json(audit_export.build([ds])))
    code, out, _ = run(path)
    assert code == 0, out
