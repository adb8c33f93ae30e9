"""Validation of a synthesis request against the dataset's public metadata (no data read,
no torch, no JAX)."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, replace

import numpy as np

from engines.types import DatasetMeta, PlanError
from engines.validation import is_number as _finite, run_accountant_error, run_delta_error, span_error, unknown_keys, unknown_message

from . import encoding

KINDS = ("synthesize",)
METHODS = ("mst", "aim", "vae")
MAX_ROWS = 5_000_000
# synthetic rows x columns: the sampler holds each cell as an int64 code, again decoded,
# and the table's CSV and Parquet as they are written. 5M rows of 60 columns were
# admitted, charged, and the worker killed out of memory while sampling; a probe's MST at
# 1e8 cells (5M rows of 20 columns) passed 3.8 GB: about 40 bytes a cell, 1 GB at this limit.
MAX_CELLS = 25_000_000
MAX_BINS = 256
DEFAULT_BINS = 20
DEFAULT_ROWS_PER_UNIT = 4  # the VAE's; MST and AIM default to ``auto_rows_per_unit``
MAX_AUTO_ROWS_PER_UNIT = 64
# Tuned on gss_wages at epsilon 1 and 3 (about 20 s of CPU): more epochs, wider layers or
# other batch sizes did no better.
VAE_DEFAULTS = {"epochs": 30, "batch_size": 512, "latent_dim": 8, "hidden": [64], "learning_rate": 5e-3}
MAX_ROWS_PER_UNIT = 1000
MAX_DECIMALS = 9
MIN_TREE_LEVELS, MAX_TREE_LEVELS = 4, 7
# The method when the request names none (``default_method``): measured on eleven public
# tables at epsilon 1, three runs each, twice (bench/README.md, "Synthetic data on public
# tables"), AIM was ahead of MST on the tables of at least this many training units (CPS,
# Fertility; level on loans; on nafld2 ahead in one round, behind within the runs' spread
# in the other), and level or behind below it, at 1-6 times MST's time.
AIM_DEFAULT_MIN_UNITS = 5_000
# Reweighting by the unit's rows (``model_columns``): MST and AIM keep at most k rows of
# each unit, so a unit with r > k rows weighs k / r of its share; its rows carry the
# bucket of r (``UNIT_ROWS_FACTOR``-spaced edges from k to UNIT_ROWS_TOP k) as one more
# column of the model, and the sample is drawn from the model tilted by r / k of its
# bucket (mst.tilt).
UNIT_ROWS = "__rows_of_unit__"
UNIT_ROWS_FACTOR, UNIT_ROWS_TOP = 2.0, 64
KEYS = {"method", "epsilon", "delta", "rows", "columns", "bins", "max_rows_per_unit", "holdout_fraction", "target",
        "epochs", "batch_size", "latent_dim", "hidden", "learning_rate", "accountant", "unit_weighting"}


# What a run may hold, checked before it is admitted (a probe's requests were admitted,
# charged, then killed out of memory on the worker): MST and AIM keep every pair's counts
# (AIM each candidate pair's as a dense float64 array: 8 bytes a cell, 400 MB at the
# limit); the VAE's input is one float32 a row and encoded input (each category a column
# of its own: 10,000 declared values of one column on 160,000 rows were 6.4 GB), and its
# networks are trained with per-unit clipping as the DP-SGD engine's are (their limit).
MAX_MODEL_COLUMNS = 100
MAX_PAIR_CELLS = 50_000_000
MAX_VAE_ENCODED_CELLS = 100_000_000
MAX_VAE_PARAMETERS = 5_000_000


def _model_cells(col: dict) -> int:
    """A column's cells in the model's pair marginals (numeric columns are merged to at
    most their bins or their grid values, at most 32; categorical ones keep each
    declared value that clears the noise)."""
    if col["type"] == "numeric":
        return min(encoding.cell_size(col), max(col["bins"], 32) + 1)
    return encoding.cell_size(col)


def _pairs_too_large(columns: list[dict], method: str) -> str | None:
    if len(columns) > MAX_MODEL_COLUMNS:
        return (f"{method.upper()} models every pair of its columns: at most {MAX_MODEL_COLUMNS} columns, got "
                f"{len(columns)}; name the columns to synthesize")
    cells = [_model_cells(c) for c in columns]
    total = (sum(cells) ** 2 - sum(x * x for x in cells)) // 2
    if total > MAX_PAIR_CELLS:
        widest = sorted(columns, key=_model_cells, reverse=True)[:3]
        return (f"the pairs of these columns have {total:,} cells in all (declared domains: "
                + ", ".join(f"{c['column']!r} {_model_cells(c):,}" for c in widest)
                + f"), over {MAX_PAIR_CELLS:,}: leave out or coarsen the columns with the largest domains")
    return None


def _vae_too_large(columns: list[dict], vae: dict, n_train: int) -> str | None:
    """``n_train``: the training split's rows (at most k of each unit)."""
    numeric = [c for c in columns if c["type"] == "numeric"]
    n_in = 2 * len(numeric) + sum(encoding.cell_size(c) for c in columns if c["type"] != "numeric")
    n_out = n_in + len(numeric) + sum(c["bins"] + 1 for c in numeric)  # at most: either numeric head
    widths_in = [n_in, *vae["hidden"], 2 * vae["latent_dim"]]
    widths_out = [vae["latent_dim"], *reversed(vae["hidden"]), n_out]
    params = sum((a + 1) * b for w in (widths_in, widths_out) for a, b in zip(w[:-1], w[1:]))
    if params > MAX_VAE_PARAMETERS:
        return f"the VAE has {params:,} parameters on these columns; at most {MAX_VAE_PARAMETERS:,}: narrower hidden layers"
    if n_train * n_in > MAX_VAE_ENCODED_CELLS:
        return (f"{n_train:,} training rows x {n_in:,} encoded inputs (a numeric column is 2, a categorical one "
                f"each declared value and null) is {n_train * n_in:,} cells, over {MAX_VAE_ENCODED_CELLS:,}: "
                "leave out the columns with the largest domains")
    return None


def auto_rows_per_unit(ds: DatasetMeta) -> int:
    """MST and AIM's default ``max_rows_per_unit``: the dataset's mean rows per unit (both
    registered metadata, no data read), from 1 to MAX_AUTO_ROWS_PER_UNIT. A unit's rows
    move each marginal by at most k, so the noise grows with k while the rows kept grow
    with min(rows, k) per unit: where units have many rows a larger k costs little
    accuracy and leaves less of the bias of keeping only a few rows of every unit (a
    table's busiest units weigh less in the synthetic rows than in the real ones). The
    planner halves it while the one-way noise would be refused (``planner.make_plan``)."""
    mean = int(ds.n_rows) / max(int(ds.n_units or ds.n_rows), 1)
    return max(1, min(MAX_AUTO_ROWS_PER_UNIT, int(round(mean))))


def default_method(n_train_units: int, accountant: str, distributed: bool) -> str:
    """AIM on a table of at least AIM_DEFAULT_MIN_UNITS training units, else MST; MST
    always under ``accountant: pld`` (which certifies MST only) and on a distributed
    dataset (MST counts its marginals on the cluster; AIM would read every row into one
    worker)."""
    if n_train_units >= AIM_DEFAULT_MIN_UNITS and accountant == "rdp" and not distributed:
        return "aim"
    return "mst"


def unit_rows_edges(k: int) -> list[int]:
    """The upper edges of the buckets of a unit's rows r: r <= k (weight 1), then
    (edge before, edge] up to UNIT_ROWS_TOP k, then the open last bucket."""
    edges, j = [k], 1
    while edges[-1] < UNIT_ROWS_TOP * k:
        e = min(UNIT_ROWS_TOP * k, int(round(k * UNIT_ROWS_FACTOR ** j)))
        if e > edges[-1]:
            edges.append(e)
        j += 1
    return edges


def unit_rows_weights(k: int) -> np.ndarray:
    """Each bucket's weight r / k at a representative r of the bucket: 1 for r <= k, the
    middle of (edge before, edge], and 1.25 times the top edge for the open last bucket."""
    edges = unit_rows_edges(k)
    reps = [float(k)] + [(a + 1 + b) / 2 for a, b in zip(edges, edges[1:])] + [1.25 * edges[-1]]
    return np.array(reps) / k


def unit_rows_bucket(rows: np.ndarray, k: int) -> np.ndarray:
    """The bucket (0 .. len(edges)) of each unit row count."""
    return np.searchsorted(np.array(unit_rows_edges(k)), rows, side="left").astype(np.int64)


def model_columns(spec: "Spec") -> list[dict]:
    """The columns MST and AIM model: the declared ones, and with ``unit_weighting`` the
    bucket of each row's unit's rows (a categorical column of the model, never output)."""
    if not spec.unit_weighting:
        return spec.columns
    n = len(unit_rows_edges(spec.max_rows_per_unit)) + 1
    return spec.columns + [{"column": UNIT_ROWS, "type": "categorical", "domain": list(range(n)),
                            "nullable": False}]


def with_rows_per_unit(spec: "Spec", k: int) -> "Spec":
    """``spec`` with another ``max_rows_per_unit`` (and the cells that depend on it)."""
    out = replace(spec, max_rows_per_unit=k, columns=[dict(c) for c in spec.columns])
    for col in out.columns:
        if col["type"] == "numeric" and not col["integer"] and col["decimals"] is None:
            col["cells"] = tree_cells(out.n_train_units * k)
    return out


def tree_cells(rows: int) -> int:
    """The equal-width cells MST and AIM measure a continuous numeric column on (no
    declared grid, so no fine histogram resolves values within a cell; as a tree of 4-ary
    levels, encoding.py): 4^L with L = ceil(log4(rows / 8)) kept in [4, 7]: 256 cells up to
    2,048 rows, 1,024 up to 8,192, 4,096 up to 32,768, 16,384 above. A finer last level
    lets a column whose rows fill a small part of its declared range still get several
    cells there (the tree descends only where its noisy counts are large); each level
    costs a share of the one-way budget, so a small table keeps fewer. ``rows``: the
    training units times the rows each may keep (public metadata, no data read)."""
    levels = math.ceil(math.log(max(rows, 1) / 8, 4))
    return 4 ** min(MAX_TREE_LEVELS, max(MIN_TREE_LEVELS, levels))


@dataclass
class Spec:
    method: str
    epsilon: float
    delta: float
    rows: int
    columns: list[dict]  # declared specs with "column" and "type"; numeric ones with "bins"
    n_units: int
    n_holdout_units: int
    n_train_units: int
    unit_column: str | None
    max_rows_per_unit: int
    holdout_fraction: float
    target: str | None
    sensitive: list[str] = field(default_factory=list)
    vae: dict = field(default_factory=dict)
    accountant: str = "rdp"  # "pld": MST's noise calibrated and the run certified by PLD (planner.py)
    rows_per_unit_auto: bool = False  # max_rows_per_unit not given: auto_rows_per_unit, halved while refused
    method_auto: bool = False  # method not given: default_method chose it
    unit_weighting: bool = False  # MST / AIM on a unit table: rows reweighted by their unit's rows (model_columns)
    left_out: dict = field(default_factory=dict)  # no "columns" given: each column not synthesized, and why
    refine_gaps: bool = False  # heavy gaps measured again (encoding.refines_gaps; planner._refinement_pays)

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "Spec":
        return cls(**d)

    @property
    def names(self) -> list[str]:
        return [c["column"] for c in self.columns]


def _column(name: str, col: dict, bins: int) -> dict | str:
    typ = col.get("type")
    # (registration checks all of this: a DatasetMeta built by hand, an engine called
    # directly, gets the same refusals, never a table that breaks its declarations)
    for flag in ("integer", "nullable"):
        if not isinstance(col.get(flag, False), bool):
            return f"column {name!r}: {flag} must be true or false, got {col[flag]!r}"
    if typ == "numeric":
        lo, hi = col.get("lower"), col.get("upper")
        if lo is None or hi is None:
            return (f"numeric column {name!r} has no declared bounds: the officer must declare lower and upper "
                    "(bounds read from the data would leak)")
        if not (_finite(lo) and _finite(hi)):
            return f"numeric column {name!r}: its bounds must be finite numbers, got [{lo!r}, {hi!r}]"
        if not lo < hi:
            return f"numeric column {name!r}: its lower bound {lo!r} must be below its upper bound {hi!r}"
        if problem := span_error(lo, hi):
            return f"numeric column {name!r}: {problem}"
        decimals = col.get("decimals")
        if decimals is not None and (isinstance(decimals, bool) or not isinstance(decimals, int)
                                     or not 0 <= decimals <= MAX_DECIMALS):
            return f"numeric column {name!r}: decimals must be an integer from 0 to {MAX_DECIMALS}"
        if col.get("integer") and decimals:  # (registration: "an integer column has 0 decimals")
            return f"numeric column {name!r}: an integer column has 0 decimals, got decimals {decimals}"
        integer = col.get("integer", False) or decimals == 0
        if not encoding.indexable(col):
            return (f"numeric column {name!r}: its {'integer' if integer else 'decimal'} grid on [{lo!r}, {hi!r}] "
                    "reaches more than 2^53 steps from zero, past which 64-bit floats do not hold every grid "
                    "value; declare narrower bounds"
                    + ("" if integer else " or fewer decimals"))
        if not encoding.holds_a_grid_value(col):
            return (f"numeric column {name!r}: no {'integer' if integer else f'{decimals}-decimal value'} lies "
                    f"in [{lo:g}, {hi:g}]")
        return {"column": name, "type": "numeric", "lower": float(lo), "upper": float(hi), "bins": bins,
                "integer": integer,
                "decimals": None if decimals is None or decimals == 0 else decimals,
                "nullable": col.get("nullable", True) is not False}
    if typ == "categorical":
        domain = col.get("domain")
        if not isinstance(domain, list) or not domain:
            return f"categorical column {name!r} has no declared domain"
        if not all(isinstance(v, (str, int, float, bool)) for v in domain) or len({repr(v) for v in domain}) != len(domain):
            return f"categorical column {name!r}: its domain must list distinct strings, numbers or booleans"
        return {"column": name, "type": "categorical", "domain": list(domain),
                "nullable": col.get("nullable", True) is not False}
    return f"column {name!r} is of type {typ!r}: only numeric and categorical columns can be synthesized"


def _left_out(left_out: dict[str, str], shown: int = 5) -> str:
    """Why the dataset's other columns are not synthesized (for a refusal's message)."""
    if not left_out:
        return ""
    reasons = list(left_out.values())
    more = f"; and {len(reasons) - shown} more" if len(reasons) > shown else ""
    return f"; left out: {'; '.join(reasons[:shown])}{more}"


def validate(kind: str, params: dict, ds: DatasetMeta) -> Spec:
    if not isinstance(params, dict):
        raise PlanError("params must be an object", {"params": "must be an object"})
    errors: dict[str, str] = {}
    unknown, n_unknown = unknown_keys(params, KEYS)
    if unknown:
        errors["params"] = f"unknown parameter(s): {unknown_message(unknown, n_unknown)}"
    method_auto = "method" not in params
    method = params.get("method", "mst")  # (no method: default_method, once the training units are known)
    if method not in METHODS:
        errors["method"] = f"must be one of {', '.join(METHODS)}, got {method!r}"
    eps = params.get("epsilon")
    if not _finite(eps) or eps <= 0 or eps > 100:
        errors["epsilon"] = ("required: a number in (0, 100]" if eps is None
                             else f"must be a number in (0, 100], got {eps!r}")
    delta = params.get("delta", ds.delta)
    if not _finite(delta) or not 0 < delta < 0.1:
        errors["delta"] = f"must be a number in (0, 0.1), got {delta!r}"
    elif problem := run_delta_error(delta, ds.delta):
        errors["delta"] = problem
    rows = params.get("rows", ds.n_rows)
    if isinstance(rows, bool) or not isinstance(rows, int) or not 1 <= rows <= MAX_ROWS:
        errors["rows"] = f"must be an integer from 1 to {MAX_ROWS:,}, got {rows!r}"
    bins = params.get("bins", DEFAULT_BINS)
    if isinstance(bins, bool) or not isinstance(bins, int) or not 2 <= bins <= MAX_BINS:
        errors["bins"] = f"must be an integer from 2 to {MAX_BINS}, got {bins!r}"
        bins = DEFAULT_BINS
    k, auto_k = 1, False
    if ds.unit_column:
        auto_k = "max_rows_per_unit" not in params and method in ("mst", "aim")
        k = params.get("max_rows_per_unit", auto_rows_per_unit(ds) if auto_k else DEFAULT_ROWS_PER_UNIT)
        if isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= MAX_ROWS_PER_UNIT:
            errors["max_rows_per_unit"] = f"must be an integer from 1 to {MAX_ROWS_PER_UNIT}, got {k!r}"
            k = 1
    elif "max_rows_per_unit" in params:
        errors["max_rows_per_unit"] = "this dataset has no privacy-unit column: each row is a unit"
    hf = params.get("holdout_fraction", 0.2)
    if not _finite(hf) or not 0 <= hf <= 0.5:
        errors["holdout_fraction"] = f"must be a number in [0, 0.5], got {hf!r}"
        hf = 0.2
    n_units = int(ds.n_units or ds.n_rows)
    n_holdout = int(round(n_units * (hf or 0.0)))
    n_train = n_units - n_holdout
    if method_auto:
        method = default_method(n_train, params.get("accountant", "rdp"), ds.distributed)
    weighting = params.get("unit_weighting", True)
    weighs = bool(ds.unit_column) and method in ("mst", "aim") and not ds.distributed
    if not isinstance(weighting, bool):
        errors["unit_weighting"] = f"must be true or false, got {weighting!r}"
    elif "unit_weighting" in params and not weighs:
        errors["unit_weighting"] = "only for mst and aim on a dataset with a privacy-unit column, not distributed"

    names = params.get("columns")
    columns: list[dict] = []
    left_out: dict[str, str] = {}
    if names is None:
        for c, spec in ds.columns.items():
            if c != ds.unit_column:
                col = _column(c, spec, bins)
                if isinstance(col, dict):
                    columns.append(col)
                else:
                    left_out[c] = col
        if not columns:
            errors["columns"] = ("the dataset has no column that can be synthesized (bounded numeric or categorical)"
                                 + _left_out(left_out))
    elif not isinstance(names, list) or not names or not all(isinstance(c, str) for c in names) \
            or len(set(names)) != len(names):
        errors["columns"] = "must be a non-empty list of distinct column names"
    else:
        problems = []
        for c in names:
            if c not in ds.columns:
                problems.append(f"unknown column {c!r}")
            elif c == ds.unit_column:
                problems.append(f"{c!r} is the privacy-unit column (it is never synthesized)")
            else:
                col = _column(c, ds.columns[c], bins)
                (problems.append(col) if isinstance(col, str) else columns.append(col))
        if problems:
            errors["columns"] = "; ".join(problems)
    if columns and isinstance(rows, int) and "rows" not in errors and rows * len(columns) > MAX_CELLS:
        errors["rows"] = (f"{rows:,} rows x {len(columns)} columns is {rows * len(columns):,} cells, over "
                          f"{MAX_CELLS:,}: ask for fewer rows (at most {MAX_CELLS // len(columns):,}) or columns")
    if columns and len(columns) < 2 and method in ("mst", "aim") and "columns" not in errors:
        errors["columns"] = f"{method.upper()} needs at least two columns" + _left_out(left_out)
    if method in ("mst", "aim") and "columns" not in errors and (problem := _pairs_too_large(columns, method)):
        errors["columns"] = problem
    target = params.get("target")
    if target is not None and target not in [c["column"] for c in columns]:
        errors["target"] = "must be one of the synthesized columns (used for train-synthetic-test-real utility)"
    vae = {}
    if method == "vae":
        vae = {"epochs": params.get("epochs", VAE_DEFAULTS["epochs"]),
               "batch_size": params.get("batch_size", max(1, min(VAE_DEFAULTS["batch_size"], n_train // 4))),
               "latent_dim": params.get("latent_dim", VAE_DEFAULTS["latent_dim"]),
               "hidden": params.get("hidden", VAE_DEFAULTS["hidden"]),
               "learning_rate": params.get("learning_rate", VAE_DEFAULTS["learning_rate"])}
        if isinstance(vae["epochs"], bool) or not isinstance(vae["epochs"], int) or not 1 <= vae["epochs"] <= 500:
            errors["epochs"] = f"must be an integer from 1 to 500, got {vae['epochs']!r}"
        if isinstance(vae["batch_size"], bool) or not isinstance(vae["batch_size"], int) or vae["batch_size"] < 1:
            errors["batch_size"] = f"must be a positive integer, got {vae['batch_size']!r}"
        if isinstance(vae["latent_dim"], bool) or not isinstance(vae["latent_dim"], int) \
                or not 1 <= vae["latent_dim"] <= 256:
            errors["latent_dim"] = f"must be an integer from 1 to 256, got {vae['latent_dim']!r}"
        h = vae["hidden"]
        if not isinstance(h, list) or not 1 <= len(h) <= 8 or not all(
                isinstance(w, int) and not isinstance(w, bool) and 1 <= w <= 4096 for w in h):
            errors["hidden"] = "must be a list of 1 to 8 layer widths from 1 to 4096"
        if not _finite(vae["learning_rate"]) or not 0 < vae["learning_rate"] <= 1:
            errors["learning_rate"] = "must be a number in (0, 1]"
        if columns and "columns" not in errors and not {"hidden", "latent_dim"} & set(errors) \
                and (problem := _vae_too_large(columns, vae, min(int(ds.n_rows), n_train * k))):
            errors["hidden" if problem.startswith("the VAE has") else "columns"] = problem
    else:
        for key in ("epochs", "batch_size", "latent_dim", "hidden", "learning_rate"):
            if key in params:
                errors[key] = "only for method vae"
    accountant = params.get("accountant", "rdp")
    if problem := run_accountant_error(accountant, ds.allow_pld):
        errors["accountant"] = problem
    elif accountant == "pld" and method != "mst":
        errors["accountant"] = "pld certifies MST runs only; use rdp"
    elif accountant == "pld" and k != 1:
        # the discrete Gaussian's exact PLD is for one changed cell; k rows of a unit move
        # a marginal by an integer vector, whose worst case is not known to be one cell
        errors["accountant"] = "pld certifies MST at one row per privacy unit only (max_rows_per_unit 1); use rdp"
    if n_train < 10:
        errors["dataset"] = f"too small to synthesize: {n_units} privacy units"
    if method == "vae" and "batch_size" not in errors and vae["batch_size"] > n_train:
        errors["batch_size"] = f"{vae['batch_size']} is larger than the training split ({n_train} units)"
    if errors:
        first = next(iter(errors.items()))
        raise PlanError(f"invalid synthesis request: {first[0]}: {first[1]}", errors)
    sensitive = [c["column"] for c in columns if ds.columns[c["column"]].get("sensitive")]
    spec = Spec(method=method, epsilon=float(eps), delta=float(delta), rows=rows, columns=columns, n_units=n_units,
                n_holdout_units=n_holdout, n_train_units=n_train, unit_column=ds.unit_column, max_rows_per_unit=k,
                holdout_fraction=float(hf), target=target, sensitive=sensitive, vae=vae, accountant=accountant,
                rows_per_unit_auto=auto_k, method_auto=method_auto,
                unit_weighting=weighting is True and weighs and UNIT_ROWS not in ds.columns, left_out=left_out,
                refine_gaps=method in ("mst", "aim") and not ds.distributed
                and any(encoding.refines_gaps(c) for c in columns))
    return with_rows_per_unit(spec, k)  # the cells of continuous columns
