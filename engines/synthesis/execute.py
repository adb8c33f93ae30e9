"""A synthesis run: hold out units for the reports, bound each unit's rows, synthesize
(MST or the DP-VAE), write the table, and compute the quality and privacy reports.

The reports compare the synthetic table with the private rows (the training rows and a
held-out sample), so they are **not** released to the analyst: they go to the privacy
officer only (``Release.officer_report`` and files in ``workdir/officer``). Releasing
them would be a second, unaccounted release of statistics of the private data; making
dozens of such statistics DP would cost more budget than the synthetic table itself. The
officer, the custodian of the data, reads them and decides whether the table may go out.
"""

from __future__ import annotations

import csv
import json
import os
from contextlib import nullcontext
from pathlib import Path
from typing import NamedTuple

import numpy as np
import pandas as pd

from engines.spreadsheet import formula_safe
from engines.types import Release, before_the_first_step

from . import encoding
from .params import UNIT_ROWS, Spec, model_columns, unit_rows_bucket, unit_rows_weights
from .planner import DETAILS_VERSION


def secure_rng() -> np.random.Generator:
    return np.random.default_rng(int.from_bytes(os.urandom(16), "little"))


class Split(NamedTuple):
    train: pd.DataFrame  # the training rows, at most k per unit (+ ``UNIT_ROWS`` with unit weighting)
    holdout: pd.DataFrame  # every row of a random fraction of the units
    train_units: np.ndarray  # the unit of each training row
    compared: pd.DataFrame  # every row of the training units: what the reports compare the table with


def split(df: pd.DataFrame, spec: Spec, rng: np.random.Generator) -> Split:
    """Hold out a random fraction of the units, keep at most k rows of each other unit and,
    with ``spec.unit_weighting``, give each kept row the bucket of its unit's rows."""
    from engines.aggregates.units import bound_contributions

    if spec.unit_column:
        units, _ = pd.factorize(df[spec.unit_column], use_na_sentinel=False)
    else:
        units = np.arange(len(df))
    n_units = int(units.max()) + 1 if len(units) else 0
    held = np.zeros(n_units, dtype=bool)
    held[rng.permutation(n_units)[:int(round(n_units * spec.holdout_fraction))]] = True
    in_train = train_mask = ~held[units]
    if spec.unit_column:
        train_mask, _ = bound_contributions(in_train, units, n_units, spec.max_rows_per_unit, rng)
    cols = spec.names
    train = df.loc[train_mask, cols].reset_index(drop=True)
    compared = df.loc[in_train, cols].reset_index(drop=True) if spec.unit_column else train
    if spec.unit_weighting:
        rows = np.bincount(units, minlength=n_units)
        train = train.assign(**{UNIT_ROWS: unit_rows_bucket(rows[units[train_mask]], spec.max_rows_per_unit)})
    return Split(train, df.loc[held[units], cols].reset_index(drop=True), units[train_mask], compared)


def _schema(spec: Spec) -> dict:
    return {c["column"]: {k: v for k, v in c.items() if k != "column"} for c in spec.columns}


def check_version(plan) -> dict:
    d = plan.details_of("synthesis", DETAILS_VERSION)
    return d


def execute(request, dataset, data, plan, progress, workdir) -> Release:
    d = check_version(plan)
    spec = Spec.from_dict(d["spec"])
    rng = secure_rng()
    with before_the_first_step() if spec.method == "vae" else nullcontext():
        progress({"phase": "preparing data", "fraction": 0.0})
        train, holdout, train_units, compared = split(data.to_pandas(), spec, rng)
    info: dict = {}
    if spec.method in ("mst", "aim"):
        from . import aim, mst

        fine_cols = [c for c in spec.columns if encoding.has_fine(c)]
        md = d[spec.method]
        fine = mst.measure_fine({c["column"]: encoding.grid_encode(train, c) for c in fine_cols},
                                {c["column"]: encoding.grid_size(c) for c in fine_cols}, md)
        fine_scale = md["fine"]["scale"] if fine else None
        heavy = {c["column"]: encoding.heavy_leaf_mass(c, fine[c["column"]], fine_scale) for c in fine_cols}
        gaps = {c["column"]: measure_gaps(train, c, fine[c["column"]], fine_scale, md)
                for c in fine_cols if spec.refine_gaps and encoding.refines_gaps(c)}
        engine = mst if spec.method == "mst" else aim
        columns = model_columns(spec)
        reweight = (UNIT_ROWS, unit_rows_weights(spec.max_rows_per_unit)) if spec.unit_weighting else None
        codes, info, weights = engine.synthesize(encoding.cell_encode(train, columns), columns, md, spec.rows,
                                                 progress, heavy=heavy, reweight=reweight)
        synthetic = encoding.cell_decode(codes, spec.columns, rng, weights, fine, fine_scale, gaps)
    else:
        from . import vae

        synthetic, info = vae.synthesize(train, spec, d["vae"], progress,
                                         units=train_units if spec.unit_column else None)
    synthetic = encoding.enforce(synthetic[spec.names], spec.columns, rng)  # a no-op on MST's tables
    return finish(d, spec, synthetic, info, compared, holdout, progress, workdir)


def measure_gaps(train: pd.DataFrame, col: dict, hist: np.ndarray, scale: float, details: dict) -> encoding.Gaps:
    """The second fine measurement of a ``refines_gaps`` column (planned and charged whether
    or not it has a heavy gap): the declared values inside the heavy gaps its noisy value
    histogram shows, with the same noise (a row counts in one cell at most)."""
    from . import mst

    gaps = encoding.heavy_gaps(col, hist, scale)
    counts = encoding.gap_counts(train, col, gaps)
    return gaps.measured(mst.measure_fine_counts({"gaps": counts}, details)["gaps"] if len(counts) else counts)


def for_people(written: pd.DataFrame) -> pd.DataFrame:
    """The synthetic table as its CSV holds it: a text cell (and a column name) a
    spreadsheet would run as a formula starts with ``'`` (a declared category is often a
    real value of the table, ``=HYPERLINK(...)`` included; a name that would then read as
    another column's gets one ``'`` more). The CSV quotes every text cell,
    so a CR inside one stays inside it (pandas quoted a lone CR nowhere: a probe's 500 rows
    read back as 631). The Parquet file keeps every value as it is."""
    names: list[str] = []
    for c in map(str, written.columns):
        safe = formula_safe(c)
        while safe != c and (safe in names or safe in written.columns):
            safe = "'" + safe  # "=eq" beside a column named "'=eq": two headers read alike (a probe)
        names.append(safe)
    out = written.set_axis(names, axis=1)
    for name in out.columns:
        if not pd.api.types.is_numeric_dtype(out[name]):
            out[name] = out[name].map(lambda v: formula_safe(v) if isinstance(v, str) else v)
    return out


def finish(d: dict, spec: Spec, synthetic: pd.DataFrame, info: dict, train: pd.DataFrame, holdout: pd.DataFrame,
           progress, workdir, reports_note: str | None = None) -> Release:
    """Write the synthetic table, the officer's reports (``train`` / ``holdout``: the rows
    they compare it with; ``reports_note`` says if they are samples), and the result."""
    workdir = Path(workdir)
    progress({"phase": "writing the table", "fraction": 0.9})
    written = encoding.as_written(synthetic, spec.columns)
    for_people(written).to_csv(workdir / "synthetic.csv", index=False, quoting=csv.QUOTE_NONNUMERIC)
    written.to_parquet(workdir / "synthetic.parquet", index=False)

    officer = None
    if len(holdout):
        progress({"phase": "quality and privacy reports", "fraction": 0.93})
        try:
            officer = reports(train, synthetic, holdout, spec, workdir / "officer")
        except MemoryError:
            # the officer's reports are read from the rows after the table is made: their
            # want of memory is no reason to withhold a table the analyst is charged for
            officer = {"not_computed": "the worker ran out of memory computing the quality and privacy reports; "
                                       "the table was released without them"}
        if reports_note:
            officer["rows_compared"] = reports_note
        # a cancel sent while the reports ran is seen here, before anything is released (a
        # probe: accepted, then the table released 3-5 s later)
        progress({"phase": "releasing", "fraction": 0.98})
    result = {
        "method": spec.method, "rows": int(len(synthetic)), "columns": spec.names, "epsilon": spec.epsilon,
        "delta": spec.delta, "planned_epsilon": d["planned_epsilon"],
        # the accountant that calibrated the run and certifies ``certified_epsilon`` (pld: MST only)
        "certified_by": d.get("certified_by", "rdp"),
        "certified_epsilon": d.get("certified_epsilon", d["planned_epsilon"]),
        "max_rows_per_unit": spec.max_rows_per_unit,
        "numeric_bins": {c["column"]: c["bins"] for c in spec.columns if c["type"] == "numeric"}, **info,
        # the dataset's columns not synthesized (no "columns" asked), and why: public schema facts
        **({"columns_left_out": spec.left_out} if spec.left_out else {}),
        "reports": ("none (holdout_fraction 0)" if officer is None else "not computed for this run"
                    if "not_computed" in officer else
                    "computed and shown to the privacy officer only: they compare the table with the private rows"),
    }
    return Release(result=result, officer_report=officer)


def reports(train: pd.DataFrame, synthetic: pd.DataFrame, holdout: pd.DataFrame, spec: Spec, outdir: Path) -> dict:
    from threadpoolctl import threadpool_limits

    from . import report

    schema = _schema(spec)
    with threadpool_limits(limits=1, user_api="openmp"):  # OpenMP oversubscription on busy workers: 0.5 s -> 35 s
        quality = report.quality_report(train, synthetic, holdout, schema, target=spec.target)
        privacy = report.privacy_report(train, synthetic, holdout, schema, sensitive=spec.sensitive)
    outdir.mkdir(parents=True, exist_ok=True)
    (outdir / "quality.json").write_text(json.dumps(quality, indent=2))
    (outdir / "privacy.json").write_text(json.dumps(privacy, indent=2))
    (outdir / "report.html").write_text(report.html_report(quality, privacy, train, synthetic, schema,
                                                           title=f"Synthetic data report ({spec.method}, "
                                                                 f"epsilon {spec.epsilon:g})"))
    return {"quality": quality, "privacy": privacy}
