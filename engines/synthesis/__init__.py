"""The built-in DP synthetic-data engine: a synthetic copy of a dataset's declared columns.

Modules: ``params`` (validation), ``planner`` (the event and the noise, before any data
is read), ``encoding`` (columns to codes and back, from the declared schema), ``mst``
(marginal-based: measure, select, fit with mbi, sample), ``aim`` (AIM on MST's cells), ``vae`` (a tabular VAE trained
with the DP-SGD engine's clipping and noise), ``report`` (quality and privacy reports),
``execute`` (a run and its files), ``schema`` (JSON schemas). No Django here.
"""

from __future__ import annotations

from engines.hookspecs import hookimpl

from .params import KINDS

NAME = "synthesis"

DESCRIPTION = (
    "A differentially private synthetic copy of a dataset's declared columns, downloadable as CSV and Parquet. "
    "method mst: one- and two-way marginals measured with OpenDP's discrete Gaussian over the declared domain "
    "(numeric columns as a tree of histograms, cells merged privately as in the reference MST), a maximum "
    "spanning tree of pairs selected with report-noisy-max, a graphical model fitted with mbi (private-pgm); "
    "values kept on the declared integer / decimal grid, no nulls in a column declared nullable: false. "
    "method aim: AIM (McKenna et al. 2022) on the same cells: rounds that select, by the exponential mechanism, "
    "the pair or column the current model answers worst, measure it with the discrete Gaussian and refit, the "
    "rounds' budget annealed as a zCDP filter. "
    "method vae: a tabular VAE trained with DP-SGD. Every part of epsilon "
    "is planned and reserved before the data is read; a quality and a privacy report go to the privacy officer."
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
        from .execute import check_version  # loaded before the read (the run's modules and their libraries)

        if plan is not None:
            check_version(plan)  # a plan of another version fails here, before the read: refunded


@hookimpl
def run(engine, request, dataset, data, plan, progress, workdir):
    if engine != NAME:
        return None
    from engines.distributed import PartitionedTable

    try:
        if isinstance(data, PartitionedTable):  # a distributed dataset: MST's marginals counted on the cluster
            if plan.details.get("spec", {}).get("method") == "mst":
                from engines.distributed.synthesis import execute as run_distributed

                return run_distributed(request, dataset, data, plan, progress, workdir)
            data = data.to_arrow()  # AIM and the VAE run on rows: read them into this worker
        from .execute import execute

        return execute(request, dataset, data, plan, progress, workdir)
    finally:
        release_compiled_code()


def release_compiled_code() -> None:
    """Drop what JAX compiled for this run (mbi's model fits: each table's domain compiles
    its own code). XLA's LLVM maps 1,000-3,500 memory regions per MST or AIM run and
    keeps them while the compiled functions are cached; a worker process that ran a few
    dozen runs reached the kernel's vm.max_map_count (65,530), after which LLVM could not
    allocate and the process died by a segfault. Cleared, a process stays at its size
    after the first run."""
    import gc
    import sys

    jax = sys.modules.get("jax")
    if jax is not None:
        jax.clear_caches()
        gc.collect()
