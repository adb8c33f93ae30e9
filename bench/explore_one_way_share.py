#!/usr/bin/env python
"""Exploration (no product change): MST / AIM one-way budget share, fixed or by a rule.

Uses bench/bench_synthesis_tables.py's own load (same split), run_engine (same request,
meta, delta, default k) and score (same subsample to n = holdout rows, same bins). The
discriminator and TSTR parts of `score` are stubbed (they do not enter overall /
univariate / bivariate, and cost most of the scoring time) unless --full-score.

    OMP_NUM_THREADS=1 .venv/bin/python bench/explore_one_way_share.py --tables cps,males --shares 0.6,0.7 --runs 2
    OMP_NUM_THREADS=1 .venv/bin/python bench/explore_one_way_share.py --tables probed --shares 0.6,rule --runs 3

A share s: one_way = s, select/two_way/fine scaled together to fill 1 - s (their ratio
1:2:1 kept; without grid histograms fine goes to two_way as in _mst_parts). "rule": the
share from `rule_share(spec)` (planner-side quantities only), applied per table inside
a wrapped planner._plan_mst / _plan_aim. One JSON line per run goes to --out.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

import bench_synthesis_tables as B  # noqa: E402
from engines.synthesis import planner  # noqa: E402

BASE = dict(planner.SHARES)
AIM_BASE = dict(planner.AIM_SHARES)
CAPTURE: dict = {}


def mst_shares(s: float) -> dict:
    rest = 1.0 - s
    tot = BASE["select"] + BASE["two_way"] + BASE["fine"]
    return {"one_way": s, "select": BASE["select"] * rest / tot, "two_way": BASE["two_way"] * rest / tot,
            "fine": BASE["fine"] * rest / tot}


def aim_shares(s: float) -> dict:
    rest = 1.0 - s
    tot = AIM_BASE["fine"] + AIM_BASE["rounds"]
    return {"one_way": s, "fine": AIM_BASE["fine"] * rest / tot, "rounds": AIM_BASE["rounds"] * rest / tot}


def set_share(method: str, s: float) -> None:
    target, new = (planner.SHARES, mst_shares(s)) if method == "mst" else (planner.AIM_SHARES, aim_shares(s))
    target.clear()
    target.update(new)


# --------------------------------------------------------------------------- the rule
RULE = {"threshold": 0.02, "high": 0.8}


def planner_quantities(spec, method: str) -> dict:
    """What the planner knows before data: the one-way sd at the base share 0.6, units, k, d, n1."""
    from engines.synthesis.encoding import fine_releases, one_way_releases
    from engines.synthesis.params import model_columns

    cols, k = model_columns(spec), spec.max_rows_per_unit
    d, n1 = len(cols), sum(one_way_releases(c) for c in cols)
    m = sum(fine_releases(c, spec.refine_gaps) for c in cols)
    return {"d": d, "m": m, "n1": n1, "k": k, "units": spec.n_train_units, "rows": spec.rows}


def rule_share(sd06: float, units: int, k: int) -> float:
    """explore/RULE.md (fixed after step 1): r = sd1 at share 0.6 / (k units), the noise
    multiplier per training unit; share RULE["high"] above RULE["threshold"], else 0.6."""
    r = sd06 / (k * units)
    return RULE["high"] if r > RULE["threshold"] else 0.6


def wrap(method: str, share_spec):
    orig_mst, orig_aim = planner._plan_mst, planner._plan_aim

    def plan_mst(spec):
        q = planner_quantities(spec, "mst")
        s = share_spec
        if share_spec == "rule":
            set_share("mst", 0.6)
            _, det, _ = orig_mst(spec)
            s = rule_share(det["one_way"]["scale"], spec.n_train_units, spec.max_rows_per_unit)
        set_share("mst", s)
        out = orig_mst(spec)
        CAPTURE.update(q, share=s, sd1=out[1]["one_way"]["scale"], sd2=out[1]["two_way"]["scale"])
        return out

    def plan_aim(spec):
        q = planner_quantities(spec, "aim")
        s = share_spec
        if share_spec == "rule":
            set_share("aim", 0.6)
            _, det = orig_aim(spec)
            s = rule_share(det["one_way"]["scale"], spec.n_train_units, spec.max_rows_per_unit)
        set_share("aim", s)
        out = orig_aim(spec)
        CAPTURE.update(q, share=s, sd1=out[1]["one_way"]["scale"], rounds_rho=out[1]["rounds_rho"])
        return out

    planner._plan_mst, planner._plan_aim = plan_mst, plan_aim
    return lambda: (setattr(planner, "_plan_mst", orig_mst), setattr(planner, "_plan_aim", orig_aim))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tables", required=True)
    ap.add_argument("--shares", default="0.6,0.7,0.8,0.9")
    ap.add_argument("--runs", type=int, default=2)
    ap.add_argument("--method", default="mst")
    ap.add_argument("--epsilon", type=float, default=1.0)
    ap.add_argument("--out", default=None)
    ap.add_argument("--full-score", action="store_true")
    ap.add_argument("--rule", default="0.02,0.8", help="threshold,high of rule_share")
    args = ap.parse_args()
    RULE["threshold"], RULE["high"] = (float(x) for x in args.rule.split(","))
    if not args.full_score:
        B.discriminator = lambda *a, **k: float("nan")
        B.tstr = lambda *a, **k: float("nan")
    groups = {"tables": B.TABLES, "unseen": B.UNSEEN, "fresh": B.FRESH, "probed": B.PROBED}
    keys = [k for t in args.tables.split(",") for k in ([u[0] for u in groups[t]] if t in groups else [t])]
    shares = [s if s == "rule" else float(s) for s in args.shares.split(",")]
    out = open(args.out, "a") if args.out else None
    print(f"# {time.strftime('%Y-%m-%d %H:%M:%S UTC', time.gmtime())} method {args.method} eps {args.epsilon} "
          f"shares {shares} runs {args.runs} rule {args.rule}", flush=True)
    for key in keys:
        train, holdout, schema, unit, cols, target = B.load(key)
        n = len(holdout)
        rng = np.random.default_rng(B.SEED)
        floor = B.score(train, holdout, B.independent(train, cols, len(train), rng), cols, schema, target, n)
        ceil = B.score(train, holdout, holdout, cols, schema, target, n)
        print(f"{key:<9} floor {floor['overall']:.4f} (u {floor['univariate']:.4f} b {floor['bivariate']:.4f})  "
              f"ceiling {ceil['overall']:.4f} (u {ceil['univariate']:.4f} b {ceil['bivariate']:.4f})", flush=True)
        for s in shares:
            for r in range(args.runs):
                restore = wrap(args.method, s)
                try:
                    CAPTURE.clear()
                    syn, sec = B.run_engine(train, schema, unit, args.epsilon, args.method)
                finally:
                    restore()
                    set_share("mst", 0.6)
                    set_share("aim", 0.6)
                sc = B.score(train, holdout, syn, cols, schema, target, n)
                rec = {"table": key, "method": args.method, "eps": args.epsilon, "share_arg": s, "run": r,
                       **CAPTURE, "overall": sc["overall"], "univariate": sc["univariate"],
                       "bivariate": sc["bivariate"], "floor": floor["overall"], "ceiling": ceil["overall"],
                       "floor_u": floor["univariate"], "floor_b": floor["bivariate"], "sec": sec}
                print(f"{key:<9} share {str(s):<5} ({CAPTURE['share']:.3f}) run {r}: overall {sc['overall']:.4f} "
                      f"univ {sc['univariate']:.4f} biv {sc['bivariate']:.4f} | units {CAPTURE['units']} "
                      f"k {CAPTURE['k']} d {CAPTURE['d']} n1 {CAPTURE['n1']} m {CAPTURE['m']} "
                      f"sd1 {CAPTURE['sd1']:.1f} sd1/(k units) {CAPTURE['sd1'] / CAPTURE['k'] / CAPTURE['units']:.4f} "
                      f"{sec:.1f}s", flush=True)
                if out:
                    out.write(json.dumps(rec) + "\n")
                    out.flush()


if __name__ == "__main__":
    main()
