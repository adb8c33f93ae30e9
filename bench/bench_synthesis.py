#!/usr/bin/env python
"""Synthetic-data benchmark: the synthesis engine's methods against smartnoise-synth 1.0.8's
MST and AIM on ``stevedata/gss_wages``, every table scored by the same report functions.

    .venv/bin/python bench/bench_synthesis.py            # epsilon 1 and 3, every method (~1 h on 2 CPUs, AIM most of it)
    .venv/bin/python bench/bench_synthesis.py --quick    # epsilon 1; engine mst + smartnoise mst (~5 min)
    .venv/bin/python bench/bench_synthesis.py --sweep    # + engine MST variants (bins, budget split, iterations, schema)
    .venv/bin/python bench/bench_synthesis.py --methods mst,sn-mst --epsilons 1 --repeats 3

**Data.** ``tests.real_data.gss_wages()`` (61,697 rows, 10 columns) with the declared schema
``tests.real_data.GSS_SCHEMA`` completed as the service completes it on registration
(``governance.datasets.schema.infer_schema`` + ``validate_schema`` on the Arrow table: types, and
``integer`` from the Arrow type, i.e. only ``year``: the other numeric columns hold nulls
and are float64). Split once, 80/20, by a permutation from ``--split-seed``: the 80%
(49,358 rows) is what every synthesizer trains on, the 20% (12,339 rows) is the holdout.

**Methods** (each run in its own fresh process; the parent only scores):

* ``mst`` / ``vae`` -- this engine, through ``engines.plugins.plan("synthesis",
  EngineRequest("synthesize", params), DatasetMeta(...))`` and ``engines.plugins.run(...,
  workdir=tmpdir)`` with params ``{"method", "epsilon", "rows": 49,358,
  "holdout_fraction": 0}`` (the bench splits; the engine gets only the 80% as its table;
  ``DatasetMeta.n_rows = n_units`` = 49,358, delta = the service's "auto" 1/n^1.2 =
  2.33e-6); everything else default (20 bins per numeric column; vae: 30 epochs, batch
  512). ``vae`` runs only when engines/synthesis/vae.py exists.
* ``sn-mst`` / ``sn-aim`` -- smartnoise-synth 1.0.8 ``Synthesizer.create("mst"|"aim",
  epsilon, delta=<the same delta>)``, ``fit`` + ``sample(49,358)`` (its shipped sampler),
  run by bench/smartnoise_driver.py in bench/.venv-smartnoise (bench/setup_smartnoise.sh).
  It gets the same public metadata: each numeric column a ``BinTransformer`` over the
  declared bounds with the same 20 bins, each categorical a ``LabelTransformer`` over the
  declared domain, both fitted on that metadata only (``preprocessor_eps`` 0: nothing is
  read from the data). AIM keeps its defaults (16 rounds per encoded column, 80 MB model).
* ``holdout`` -- the ceiling: the real 20% holdout scored as if it were synthetic.

**Metrics**, all from ``engines.synthesis.report`` (the functions the engine's officer
report uses), in this process, with its default seed 0, for every table alike:
``quality_report(train, synthetic, holdout, schema, target="gender")`` -- overall,
univariate (20 bins) and bivariate (10 x 10 bins) accuracy = 1 - total variation distance
to the train table; discriminator AUC (gradient boosting telling train rows from
synthetic ones); TSTR = ROC AUC on the holdout of a model predicting ``gender`` (binary,
declared domain, never null) from the 9 other columns trained on 20,000 synthetic rows,
next to TRTR (the same model trained on 20,000 train rows) -- and
``privacy_report(train, synthetic, holdout, schema)``: DCR ratio = median distance of
synthetic rows to their closest train row / the same for holdout rows. For the holdout
row TSTR is TRTR by definition (training on the holdout and testing on it would be
in-sample). The schema the metrics use is always the base one, also when a sweep variant
gives the engine another.

**Seconds**: ``plan`` + ``run`` (engine) or ``fit`` + ``sample`` (smartnoise), in a fresh
process after its imports (JAX, mbi, OpenDP / torch) -- as in a worker that has run a job
before, but with JAX's compilations still to do; "proc s" is the whole child process. The
engine's runs are not seeded (it draws from ``os.urandom``), so they differ between runs:
``--repeats`` > 1 prints the median and the range.

**Goals** (the issue's, at epsilon 1, for each engine method): overall accuracy >= 0.96,
bivariate >= 0.93, discriminator AUC <= 0.80, TSTR within 0.07 AUC of TRTR, seconds <= the
seconds of smartnoise MST.

``--sweep``: the engine's MST at epsilon 1 with ``bins``, the budget split
(``engines.synthesis.planner.SHARES``: one-way / selection / two-way / fine histograms,
monkeypatched in the child), mbi's iterations (``engines.synthesis.mst.synthesize(iters=...)``)
and the declared upper bound of ``realrinc`` varied one at a time, and
``--diagnose`` (on by default for the full run) the discriminator AUC on each column
alone, which shows what gives a synthetic table away.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import date
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))  # engines, governance, tests
BENCH = REPO / "bench"
SN_PY = BENCH / ".venv-smartnoise" / "bin" / "python"
SN_DRIVER = BENCH / "smartnoise_driver.py"
TARGET = "gender"
SPLIT_SEED = 20261121
ENGINE_METHODS = ("mst", "vae")
SN_METHODS = ("sn-mst", "sn-aim")
LABELS = {"mst": "engine mst", "vae": "engine vae", "sn-mst": "smartnoise mst", "sn-aim": "smartnoise aim",
          "holdout": "holdout (ceiling)"}
GOALS = {"overall": 0.96, "bivariate": 0.93, "discriminator": 0.80, "tstr_gap": 0.07}

# engine MST variants for --sweep: (label, extra request params, child options, schema changes)
SWEEP = [
    ("default (bins 20, split .2/.1/.6/.1, 1000 iters)", {}, {}, {}),
    ("bins 10", {"bins": 10}, {}, {}),
    ("bins 32", {"bins": 32}, {}, {}),
    ("bins 48", {"bins": 48}, {}, {}),
    ("split .1/.1/.7/.1", {}, {"shares": "0.1,0.1,0.7,0.1"}, {}),
    ("split .3/.1/.5/.1", {}, {"shares": "0.3,0.1,0.5,0.1"}, {}),
    ("split .2/.02/.68/.1", {}, {"shares": "0.2,0.02,0.68,0.1"}, {}),
    ("split .2/.1/.65/.05", {}, {"shares": "0.2,0.1,0.65,0.05"}, {}),
    ("split .2/.1/.5/.2", {}, {"shares": "0.2,0.1,0.5,0.2"}, {}),
    ("mbi iters 3000", {}, {"iters": 3000}, {}),
    ("schema: realrinc upper 150,000", {}, {}, {"upper": {"realrinc": 150_000}}),
    ("schema: realrinc <= 150,000, bins 32", {"bins": 32}, {}, {"upper": {"realrinc": 150_000}}),
]


# --------------------------------------------------------------------------- data


def split(seed: int):
    import numpy as np

    from tests.real_data import gss_wages

    df = gss_wages()
    perm = np.random.default_rng(seed).permutation(len(df))
    n = round(0.8 * len(df))
    return df.iloc[np.sort(perm[:n])].reset_index(drop=True), df.iloc[np.sort(perm[n:])].reset_index(drop=True)


def declared_columns(train) -> dict:
    """The schema the service stores for this table: GSS_SCHEMA merged onto the inferred draft."""
    import pyarrow as pa

    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "governance.settings")
    import django

    django.setup()
    from governance.datasets.schema import infer_schema, validate_schema
    from tests.real_data import GSS_SCHEMA

    table = pa.Table.from_pandas(train, preserve_index=False)
    merged = validate_schema(GSS_SCHEMA, table.schema, "", base=infer_schema(table))
    return {c["name"]: {k: v for k, v in c.items() if k != "name"} for c in merged["columns"]}


def auto_delta(n: int) -> float:
    from governance.datasets.budget import auto_delta as service_auto_delta

    return service_auto_delta(n)


def with_changes(columns: dict, changes: dict) -> dict:
    out = json.loads(json.dumps(columns))
    for c in changes.get("integer", []):
        out[c]["integer"] = True
    for c, hi in changes.get("upper", {}).items():
        out[c]["upper"] = hi
    return out


def normalise(df, columns: dict):
    """Numeric -> float64 (NaN = null), categorical -> object (None = null), schema column order."""
    import pandas as pd

    out = {}
    for c, spec in columns.items():
        if spec["type"] == "numeric":
            out[c] = pd.to_numeric(df[c], errors="coerce").astype("float64")
        else:
            s = df[c].astype(object)
            out[c] = s.where(s.notna(), None)
    return pd.DataFrame(out)


# --------------------------------------------------------------------------- children


def child_engine(args) -> int:
    """One engine run in this (fresh) process: plan + run on <workdir>/train.parquet."""
    w = Path(args.workdir)
    job = json.loads((w / "job.json").read_text())
    import pyarrow.parquet as pq

    from engines import plugins
    from engines.synthesis import planner
    from engines.types import DatasetMeta, EngineRequest

    if job["params"].get("method", "mst") == "mst":
        import opendp.prelude  # noqa: F401

        from engines.synthesis import mst

        mst._mbi()  # import JAX and mbi before the clock starts
        if job.get("iters"):
            original, iters = mst.synthesize, int(job["iters"])
            mst.synthesize = lambda *a, **k: original(*a, **{**k, "iters": iters})
    else:
        import torch  # noqa: F401

        from engines.synthesis import vae  # noqa: F401
    if job.get("shares"):  # in the order of planner.SHARES (one_way, select, two_way, fine)
        planner.SHARES.update(zip(planner.SHARES, (float(x) for x in job["shares"].split(",")), strict=True))

    table = pq.read_table(w / "train.parquet")
    meta = DatasetMeta(name="gss_wages_train", columns=job["columns"], unit_column=None, n_rows=table.num_rows,
                       n_units=table.num_rows, delta=job["delta"])
    request = EngineRequest("synthesize", job["params"])
    phases = []
    out = w / "out"
    out.mkdir(exist_ok=True)
    t0 = time.perf_counter()
    plan = plugins.plan("synthesis", request, meta)
    t1 = time.perf_counter()

    def progress(p):
        phases.append((p.get("phase"), time.perf_counter() - t1))

    release = plugins.run("synthesis", request, meta, table.select(plan.columns), plan, progress, workdir=out)
    t2 = time.perf_counter()
    info = {"plan_seconds": t1 - t0, "run_seconds": t2 - t1, "seconds": t2 - t0, "phases": phases,
            "planned_epsilon": plan.details.get("planned_epsilon"), "result": release.result,
            "synthetic": str(out / "synthetic.parquet")}
    (w / "info.json").write_text(json.dumps(info, default=str))
    return 0


def run_child(cmd: list, cwd: Path, log: Path, timeout: float) -> tuple[int, float]:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    env.pop("DJANGO_SETTINGS_MODULE", None)
    t0 = time.perf_counter()
    with open(log, "w") as f:
        try:
            rc = subprocess.run(cmd, check=False, cwd=cwd, env=env, stdout=f, stderr=subprocess.STDOUT,
                                timeout=timeout).returncode
        except subprocess.TimeoutExpired:
            rc = -9
    return rc, time.perf_counter() - t0


def tail(path: Path, n: int = 6) -> str:
    try:
        return " | ".join(path.read_text(errors="replace").strip().splitlines()[-n:])
    except OSError:
        return ""


def synthesize(method: str, eps: float, base: Path, ctx: dict, tag: str, extra_params=None, child_opts=None,
               columns=None) -> dict:
    """Run one synthesizer in a child process; return {"synthetic": DataFrame, "seconds", ...} or {"error"}."""
    import pandas as pd

    w = Path(tempfile.mkdtemp(prefix=f"{tag}-", dir=base))
    load0 = os.getloadavg()[0]
    if method in ENGINE_METHODS:
        (w / "train.parquet").symlink_to(ctx["train_parquet"])
        params = {"method": method, "epsilon": eps, "rows": ctx["n_train"], "holdout_fraction": 0,
                  **(extra_params or {})}
        job = {"params": params, "columns": columns or ctx["columns"], "delta": ctx["delta"], **(child_opts or {})}
        (w / "job.json").write_text(json.dumps(job))
        cmd = [sys.executable, str(Path(__file__).resolve()), "--child-engine", str(w)]
        rc, wall = run_child(cmd, w, w / "log.txt", ctx["timeout"])
        if rc != 0 or not (w / "info.json").exists():
            return {"error": f"exit {rc}: {tail(w / 'log.txt')}", "proc_seconds": wall}
        info = json.loads((w / "info.json").read_text())
        syn = pd.read_parquet(info["synthetic"])
    else:
        synth = method.split("-", 1)[1]
        cmd = [str(SN_PY), str(SN_DRIVER), "--synth", synth, "--epsilon", str(eps), "--delta", repr(ctx["delta"]),
               "--train", str(ctx["train_csv"]), "--spec", str(ctx["sn_spec"]), "--rows", str(ctx["n_train"]),
               "--out", str(w / "synthetic.csv"), "--info", str(w / "info.json")]
        rc, wall = run_child(cmd, w, w / "log.txt", ctx["timeout"])
        if rc != 0 or not (w / "info.json").exists():
            return {"error": f"exit {rc}: {tail(w / 'log.txt')}", "proc_seconds": wall}
        info = json.loads((w / "info.json").read_text())
        dtypes = {c: (object if s["type"] == "categorical" else "float64") for c, s in ctx["columns"].items()}
        syn = pd.read_csv(w / "synthetic.csv", dtype=dtypes, keep_default_na=False, na_values=[""])
    return {"synthetic": normalise(syn, ctx["columns"]), "seconds": info["seconds"], "proc_seconds": wall,
            "info": info, "load": (load0, os.getloadavg()[0])}


# --------------------------------------------------------------------------- scoring


def score(train, synthetic, holdout, schema: dict, tstr: bool = True) -> dict:
    from engines.synthesis import report

    q = report.quality_report(train, synthetic, holdout, schema, target=TARGET if tstr else None)["summary"]
    p = report.privacy_report(train, synthetic, holdout, schema)["summary"]
    return {"overall": q["overall_accuracy"], "univariate": q["univariate_accuracy"],
            "bivariate": q["bivariate_accuracy"], "discriminator": q["discriminator_auc"],
            "tstr": q.get("tstr"), "trtr": q.get("trtr"), "tstr_gap": q.get("tstr_gap"),
            "dcr_ratio": p["dcr_ratio"], "membership_auc": p["membership_auc"],
            "exact_copy_share": p["exact_copy_share"]}


def per_column_discriminator(train, synthetic, holdout, schema: dict) -> dict:
    """AUC of report's discriminator given one column at a time (same rows as quality_report's)."""
    from engines.synthesis import report

    n = min(len(train), len(synthetic), len(holdout), report.DISCRIMINATOR_ROWS)
    real = report._sample(train, n, report._rng(0, 3))
    fake = report._sample(synthetic, n, report._rng(0, 4))
    return {c: report._discriminator(real, fake, schema, [c], 0) for c in schema}


# --------------------------------------------------------------------------- printing


def fmt(v, spec=".3f") -> str:
    return "n/a" if v is None else format(v, spec)


def summarise(runs: list[dict]) -> dict:
    """Median of each metric over repeats (with min/max for the table when > 1)."""
    ok = [r for r in runs if "error" not in r]
    if not ok:
        return {"error": runs[-1]["error"], "n": 0}
    keys = ok[0]["metrics"].keys()
    out = {"n": len(ok), "errors": len(runs) - len(ok)}
    for k in keys:
        vals = [r["metrics"][k] for r in ok if r["metrics"][k] is not None]
        out[k] = statistics.median(vals) if vals else None
        out[k + "_range"] = (min(vals), max(vals)) if len(vals) > 1 else None
    secs = [r["seconds"] for r in ok]
    out["seconds"] = statistics.median(secs)
    out["seconds_range"] = (min(secs), max(secs)) if len(secs) > 1 else None
    out["proc_seconds"] = statistics.median(r["proc_seconds"] for r in ok)
    return out


HEADER = (f"{'method':<18} {'eps':>3} {'overall':>7} {'univ':>6} {'biv':>6} {'disc AUC':>8} "
          f"{'TSTR / TRTR AUC (gap)':>23} {'DCR ratio':>9} {'seconds':>8} {'proc s':>7}")


def row(label: str, eps, s: dict) -> str:
    if s.get("error"):
        return f"{label:<18} {eps:>3} FAILED: {s['error'][:200]}"
    tstr = f"{fmt(s.get('tstr'))} / {fmt(s.get('trtr'))} ({fmt(s.get('tstr_gap'), '+.3f')})"
    secs = "-" if s.get("seconds") is None else f"{s['seconds']:.1f}"
    proc = "-" if s.get("proc_seconds") is None else f"{s['proc_seconds']:.1f}"
    line = (f"{label:<18} {eps:>3} {fmt(s['overall']):>7} {fmt(s['univariate']):>6} {fmt(s['bivariate']):>6} "
            f"{fmt(s['discriminator']):>8} {tstr:>23} {fmt(s['dcr_ratio'], '.2f'):>9} {secs:>8} {proc:>7}")
    if s.get("n", 1) > 1:
        rng = [f"{k} {s[k + '_range'][0]:.3f}-{s[k + '_range'][1]:.3f}" for k in ("overall", "bivariate",
               "discriminator", "tstr_gap") if s.get(k + "_range")]
        line += f"\n{'':<23}median of {s['n']}; ranges: " + ", ".join(rng)
        if s.get("seconds_range"):
            line += f", seconds {s['seconds_range'][0]:.1f}-{s['seconds_range'][1]:.1f}"
    return line


def goal_lines(method: str, s: dict, sn_mst: dict | None) -> list[str]:
    if s.get("error"):
        return [f"  {LABELS[method]}: failed, no verdict"]

    def verdict(ok):
        return "PASS" if ok else "FAIL"

    gap, sn_s = s.get("tstr_gap"), (sn_mst or {}).get("seconds")
    checks = [
        (f"overall accuracy >= {GOALS['overall']}", f"{s['overall']:.3f}", s["overall"] >= GOALS["overall"]),
        (f"bivariate accuracy >= {GOALS['bivariate']}", f"{s['bivariate']:.3f}", s["bivariate"] >= GOALS["bivariate"]),
        (f"discriminator AUC <= {GOALS['discriminator']:.2f}", f"{s['discriminator']:.3f}",
         s["discriminator"] <= GOALS["discriminator"]),
        (f"TSTR within {GOALS['tstr_gap']} AUC of TRTR", f"gap {fmt(gap)}",
         None if gap is None else gap <= GOALS["tstr_gap"]),
        ("seconds <= smartnoise MST's", f"{s['seconds']:.1f} vs {fmt(sn_s, '.1f')}",
         None if sn_s is None else s["seconds"] <= sn_s),
    ]
    out = [f"  {LABELS[method]}:"]
    for goal, value, ok in checks:
        out.append(f"    {goal:<32} {value:<18} {'n/a' if ok is None else verdict(ok)}")
    return out


# --------------------------------------------------------------------------- main


def git_rev() -> str:
    try:
        rev = subprocess.run(["git", "rev-parse", "--short", "HEAD"], check=False, cwd=REPO, capture_output=True,
                             text=True).stdout
        dirty = subprocess.run(["git", "status", "--porcelain", "engines/synthesis"], check=False, cwd=REPO,
                               capture_output=True, text=True).stdout
        return rev.strip() + (" + uncommitted engines/synthesis" if dirty.strip() else "")
    except OSError:
        return "?"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="epsilon 1 only; engine mst and smartnoise mst (CI smoke)")
    ap.add_argument("--epsilons", help="comma-separated (default 1,3; --quick: 1)")
    ap.add_argument("--methods", help="comma-separated from mst,vae,sn-mst,sn-aim (default: all; --quick: mst,sn-mst)")
    ap.add_argument("--repeats", type=int, default=1, help="runs per method and epsilon (median shown; default 1)")
    ap.add_argument("--split-seed", type=int, default=SPLIT_SEED)
    ap.add_argument("--sweep", action="store_true", help="also engine MST variants at epsilon 1 (see SWEEP)")
    ap.add_argument("--sweep-repeats", type=int, default=1)
    ap.add_argument("--sweep-only", action="store_true", help="only the sweep (and the holdout ceiling)")
    ap.add_argument("--diagnose", action=argparse.BooleanOptionalAction, default=None,
                    help="per-column discriminator AUC at epsilon 1 (default: on unless --quick)")
    ap.add_argument("--timeout", type=float, default=4 * 3600, help="seconds per synthesizer run (4 h)")
    ap.add_argument("--json", type=Path, help="write every measurement here")
    ap.add_argument("--keep", action="store_true", help="keep the temp dir (tables, logs)")
    ap.add_argument("--child-engine", metavar="WORKDIR", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child_engine:
        args.workdir = args.child_engine
        return child_engine(args)

    epsilons = [float(e) for e in (args.epsilons or ("1" if args.quick else "1,3")).split(",")]
    have_vae = (REPO / "engines" / "synthesis" / "vae.py").exists()
    default_methods = ["mst", "sn-mst"] if args.quick else ["mst"] + (["vae"] if have_vae else []) + list(SN_METHODS)
    methods = args.methods.split(",") if args.methods else default_methods
    if args.sweep_only:
        methods = []
    unknown = set(methods) - set(ENGINE_METHODS) - set(SN_METHODS)
    if unknown:
        ap.error(f"unknown methods {sorted(unknown)}")
    if "vae" in methods and not have_vae:
        print("note: engines/synthesis/vae.py does not exist: vae skipped")
        methods.remove("vae")
    if any(m in SN_METHODS for m in methods) and not SN_PY.exists():
        print(f"{SN_PY} is missing: run bench/setup_smartnoise.sh first (or leave out sn-mst, sn-aim)",
              file=sys.stderr)
        return 2
    diagnose = (not args.quick) if args.diagnose is None else args.diagnose

    t_start = time.perf_counter()
    train, holdout = split(args.split_seed)
    columns = declared_columns(train)
    delta = auto_delta(len(train))
    schema = columns  # what the metrics use: the base declared schema, for every table
    base = Path(tempfile.mkdtemp(prefix="bench-synthesis-"))
    train_parquet = base / "train.parquet"
    train.to_parquet(train_parquet, index=False)
    train_csv = base / "train.csv"
    train.to_csv(train_csv, index=False)
    sn_spec = base / "sn_spec.json"
    bins = 20
    sn_spec.write_text(json.dumps({"columns": {
        c: ({"type": "numeric", "lower": s["lower"], "upper": s["upper"], "bins": bins} if s["type"] == "numeric"
            else {"type": "categorical", "domain": s["domain"]}) for c, s in columns.items()}}))
    ctx = {"train_parquet": train_parquet, "train_csv": train_csv, "sn_spec": sn_spec, "n_train": len(train),
           "columns": columns, "delta": delta, "timeout": args.timeout}
    print(f"== synthetic data: stevedata/gss_wages, {len(train) + len(holdout):,} rows x {len(columns)} columns; "
          f"train {len(train):,} / holdout {len(holdout):,} (split seed {args.split_seed}); delta {delta:.3g}; "
          f"TSTR target {TARGET!r}; code at git {git_rev()}; {date.today()}; {os.cpu_count()} CPUs; "
          f"1-min load {os.getloadavg()[0]:.2f}")
    print("   declared: " + "; ".join(
        f"{c} [{s['lower']:g}, {s['upper']:g}]{' int' if s.get('integer') else ''}" if s["type"] == "numeric"
        else f"{c} ({len(s['domain'])} values)" for c, s in columns.items()))
    if any(m in SN_METHODS for m in methods):
        probe = ("import importlib.metadata as m; "
                 "print(', '.join(p + ' ' + m.version(p) for p in ('smartnoise-synth', 'mbi', 'opendp', 'jax')))")
        v = subprocess.run([str(SN_PY), "-c", probe], check=False, capture_output=True, text=True).stdout.strip()
        print(f"   smartnoise venv: {v}")
    sys.stdout.flush()

    results: dict = {"methods": {}, "sweep": {}, "diagnose": {}}
    summaries: dict = {}
    tables: dict = {}
    for eps in epsilons:
        for m in methods:
            runs = []
            for r in range(args.repeats):
                out = synthesize(m, eps, base, ctx, f"{m}-e{eps:g}-r{r}")
                if "error" not in out:
                    out["metrics"] = score(train, out["synthetic"], holdout, schema)
                    tables.setdefault((m, eps), out["synthetic"])
                runs.append(out)
                extra = "" if "error" in out else f"; seconds {out['seconds']:.1f}, load {out['load'][0]:.1f}->" \
                                                  f"{out['load'][1]:.1f}"
                print(f"   done: {LABELS[m]} eps {eps:g} run {r + 1}/{args.repeats}"
                      f"{': FAILED ' + out['error'][:300] if 'error' in out else extra}", flush=True)
            summaries[(m, eps)] = summarise(runs)
            results["methods"][f"{m}@{eps:g}"] = [{k: v for k, v in x.items() if k != "synthetic"} for x in runs]

    ceiling = score(train, holdout, holdout, schema, tstr=False)
    trtr = next((s.get("trtr") for s in summaries.values() if s.get("trtr") is not None), None)
    if trtr is None:
        from engines.synthesis import report

        trtr = report.quality_report(train, train, holdout, schema, target=TARGET)["summary"]["trtr"]
    ceiling.update({"tstr": trtr, "trtr": trtr, "tstr_gap": 0.0, "seconds": None, "proc_seconds": None})
    results["ceiling"] = ceiling

    print()
    print(HEADER)
    print("-" * len(HEADER))
    for eps in epsilons:
        for m in methods:
            print(row(LABELS[m], f"{eps:g}", summaries[(m, eps)]))
    print(row(LABELS["holdout"], "-", ceiling))
    print("TSTR: ROC AUC of predicting gender on the holdout, trained on 20,000 synthetic rows; TRTR: on 20,000 train "
          "rows; gap = TRTR - TSTR. Holdout row: TSTR := TRTR. seconds: plan+run / fit+sample after imports; proc s: "
          "the whole child process.")

    if 1.0 in epsilons and any(m in ENGINE_METHODS for m in methods):
        print("\nGoals at epsilon 1:")
        sn = summaries.get(("sn-mst", 1.0))
        for m in methods:
            if m in ENGINE_METHODS:
                print("\n".join(goal_lines(m, summaries[(m, 1.0)], sn)))

    if any(m in SN_METHODS for m in methods):
        print("\nsmartnoise runs (privacy differences, what each got):")
        for eps in epsilons:
            for m in methods:
                if m not in SN_METHODS:
                    continue
                ok = [x for x in results["methods"][f"{m}@{eps:g}"] if "info" in x]
                if ok:
                    i = ok[0]["info"]
                    print(f"  {LABELS[m]} eps {eps:g}: epsilon left after preprocessing "
                          f"{i['epsilon_left_after_preprocessing']:g} (nothing spent: bounds and domains given); "
                          f"{i['output_columns']} encoded columns (each numeric = 20 bins + a null flag column); "
                          f"fit {i['fit_seconds']:.1f} s, sample {i['sample_seconds']:.1f} s; "
                          f"{len(i['cliques'])} cliques in the model")
        print("  - (epsilon, delta) -> zCDP rho by OpenDP's Gaussian conversion (snsynth.utils.cdp_rho); the engine "
              "plans its event with the service's RDP accountant at the same (epsilon, delta).")
        print("  - MST selection and AIM's exponential mechanism draw from numpy's global (non-cryptographic) "
              "generator over a floating-point softmax; the engine uses OpenDP's report-noisy-max and discrete "
              "Gaussian.")
        print("  - its sampler returns each numeric bin's midpoint (the engine draws inside the bin); "
              "smartnoise's documented fit(df, categorical_columns=...) would read every category from the rows "
              "(not DP) -- here the driver pre-fits the transformers on the declared domains instead.")

    if diagnose and 1.0 in epsilons and tables:
        print("\nDiscriminator AUC on one column at a time (epsilon 1; 0.5 = indistinguishable):")
        diag = {LABELS["holdout"]: per_column_discriminator(train, holdout, holdout, schema)}
        for m in methods:
            if (m, 1.0) in tables:
                diag[LABELS[m]] = per_column_discriminator(train, tables[(m, 1.0)], holdout, schema)
        names = list(diag)
        print(f"{'column':<12}" + "".join(f"{n:>19}" for n in names))
        for c in schema:
            print(f"{c:<12}" + "".join(f"{fmt(diag[n][c]):>19}" for n in names))
        results["diagnose"] = diag

    if args.sweep or args.sweep_only:
        print("\nSweep: engine MST at epsilon 1, one change at a time (metrics on the base schema):")
        head = (f"{'variant':<48} {'overall':>7} {'univ':>6} {'biv':>6} {'disc AUC':>8} {'TSTR (gap)':>15} "
                f"{'DCR':>5} {'seconds':>8}")
        print(head)
        print("-" * len(head))
        for label, params, opts, changes in SWEEP:
            runs = []
            for r in range(args.sweep_repeats):
                out = synthesize("mst", 1.0, base, ctx, f"sweep-{len(results['sweep'])}-r{r}", extra_params=params,
                                 child_opts=opts, columns=with_changes(columns, changes))
                if "error" not in out:
                    out["metrics"] = score(train, out["synthetic"], holdout, schema)
                runs.append(out)
            s = summarise(runs)
            results["sweep"][label] = [{k: v for k, v in x.items() if k != "synthetic"} for x in runs]
            if s.get("error"):
                print(f"{label:<48} FAILED: {s['error'][:200]}")
            else:
                print(f"{label:<48} {s['overall']:>7.3f} {s['univariate']:>6.3f} {s['bivariate']:>6.3f} "
                      f"{s['discriminator']:>8.3f} {fmt(s['tstr']):>7} ({fmt(s['tstr_gap'], '+.3f')}) "
                      f"{s['dcr_ratio']:>5.2f} {s['seconds']:>8.1f}" +
                      (f"  (median of {s['n']})" if s["n"] > 1 else ""), flush=True)

    print(f"\ntotal {time.perf_counter() - t_start:.0f} s; 1-min load at the end {os.getloadavg()[0]:.2f}")
    if args.json:
        args.json.write_text(json.dumps(results, indent=1, default=str))
    if args.keep:
        print(f"kept {base}")
    else:
        import shutil

        shutil.rmtree(base, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
