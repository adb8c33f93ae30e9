"""The built-in DP aggregates engine: count, sum, mean, variance, histogram, quantile, and
query (several of them in one request: what SQL becomes).

Modules: ``params`` (validation), ``planner`` (sensitivities, budget split, events; the
sensitivity statement is its docstring), ``noise`` (the only code that draws released
noise, all through OpenDP), ``compute`` (vectorised exact aggregates and contribution
bounding), ``report`` (result JSON and 95% intervals), ``execute`` (a run),
``schema`` (JSON schemas), ``sql`` (SQL text to a request), ``query`` (the query kind).
No Django here.
"""

from __future__ import annotations

from engines.hookspecs import hookimpl

from .params import KINDS
from .schema import params_schema

NAME = "aggregates"

DESCRIPTION = (
    "Differentially private aggregates over a dataset's declared columns: count, sum, mean, "
    "variance, histogram and quantile, optionally filtered (where) and grouped by a categorical "
    "column's declared domain. Laplace (pure epsilon) or Gaussian (zCDP rho) noise from OpenDP's "
    "floating-point-safe samplers; quantiles by the exponential mechanism. Values are clamped to "
    "the declared bounds; each privacy unit contributes at most max_rows_per_unit rows. The query kind (what "
    "SQL becomes) releases several aggregates over the same rows as one request, grouped by several "
    "declared columns and public bins, with HAVING / ORDER BY / LIMIT applied to the released values."
)


@hookimpl
def engine_info():
    return {"name": NAME, "kinds": [*KINDS, "query"], "queue": "cpu", "description": DESCRIPTION,
            "params_schema": params_schema(), "distributed": True}


@hookimpl
def plan(engine, request, dataset):
    if engine != NAME:
        return None
    from .planner import make_plan

    return make_plan(request, dataset)


@hookimpl
def prepare(engine, plan):
    if engine == NAME:
        from .execute import check_version  # loaded before the read (the run's modules and their libraries)

        if plan is not None:
            check_version(plan)  # a plan of another version fails here, before the read: refunded


@hookimpl
def run(engine, request, dataset, data, plan, progress):
    if engine != NAME:
        return None
    from engines.distributed import PartitionedTable

    if isinstance(data, PartitionedTable):  # a distributed dataset: exact parts on the Dask cluster
        from engines.distributed.aggregates import execute as run_distributed

        return run_distributed(request, dataset, data, plan, progress)
    from .execute import execute

    return execute(request, dataset, data, plan, progress)
