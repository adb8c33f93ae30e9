"""The built-in DP-SGD engine: an MLP trained on a dataset's declared columns.

Modules: ``params`` (validation), ``model_spec`` (the MLP language, BatchNorm fix,
building), ``calibrate`` (sampling, events, noise multiplier for a target epsilon),
``planner`` (the plan), ``features`` (rows to tensors from the declared schema),
``clipping`` (per-unit clipping by book-keeping in one backward pass), ``train`` (the
loop, DP evaluation, the epsilon cap), ``audit`` (canary membership inference),
``execute`` (a run and its files), ``parallel`` (data-parallel ranks: noise once, the
all-reduce; the Dask side is ``engines.distributed.training``), ``schema`` (JSON schemas). No Django here; torch is
imported only on workers (planning needs none).
"""

from __future__ import annotations

from engines.hookspecs import hookimpl

from .params import KINDS

NAME = "dpsgd"

DESCRIPTION = (
    "Differentially private training (DP-SGD) of an MLP classifier or regressor on a dataset's declared columns: "
    "Poisson sampling of privacy units, per-unit gradient clipping (book-keeping, one backward pass), Gaussian "
    "noise calibrated to a target epsilon with the service's RDP accountant, epsilon tracked every epoch, an "
    "optional epsilon cap that stops training and refunds the unspent steps, DP held-out metrics and a canary "
    "membership-inference audit. kind 'sweep' trains one model per epsilon and plots metric vs epsilon."
)


@hookimpl
def engine_info():
    from .schema import params_schema

    return {"name": NAME, "kinds": list(KINDS), "queue": "gpu", "description": DESCRIPTION,
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
        from .execute import check_version  # loaded before the read (torch and the rest)

        if plan is not None:
            check_version(plan)  # a plan of another version fails here, before the read: refunded


@hookimpl
def run(engine, request, dataset, data, plan, progress, workdir):
    if engine != NAME:
        return None
    from engines.distributed import PartitionedTable

    if isinstance(data, PartitionedTable):  # data-parallel ranks on the Dask cluster (or read here)
        from engines.distributed.training import execute as on_cluster

        return on_cluster(request, dataset, data, plan, progress, workdir)
    from .execute import execute

    return execute(request, dataset, data, plan, progress, workdir)
