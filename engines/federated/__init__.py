"""The federated engine: DP-FedAvg on Flower across sites that keep their rows (issue 27).

Modules: ``params`` (validation against the declared schema and registered sites),
``planner`` (the event: Poisson-subsampled Gaussian over sites, plus the DP evaluations;
noise calibrated by ``engines.dpsgd.calibrate``), ``dpfedavg`` (clip, check, sample, the
noisy mean), ``model`` (softmax regression in numpy), ``site_data`` and ``siteapp`` (the
site side), ``auth`` (per-site HMAC), ``secagg`` (Flower's SecAgg+ on any Grid),
``schema`` (the parameters' JSON schema), ``coordinator`` (the server's rounds over any
transport), ``flwr_apps`` and ``flwrapp/`` (Flower's ServerApp/ClientApp and the FAB),
``execute`` (``flwr run`` against the SuperLink, progress, cancel), ``processes`` and
``site`` (SuperLink/SuperNode processes; the site agent). No Django here; flwr is imported
by the server's and the sites' modules (``coordinator``, ``secagg``, ``flwr_apps``), never by
``params``, ``planner`` or the hooks above, which the web process calls.

In ``engines.plugins.BUILTINS``: the governance side (``governance.datasets.federated``:
federated datasets, their sites, ``FEDERATED_SUPERLINK``) passes a ``Federation``.
"""

from __future__ import annotations

from engines.hookspecs import hookimpl

NAME = "federated"
DESCRIPTION = ("Federated training across sites that keep their rows (Flower): DP-FedAvg with client-level DP "
               "(updates clipped at the site and checked at the server, Gaussian noise on the sum, sites Poisson-"
               "sampled each round; optionally Flower's SecAgg+, the server then seeing only the sum), or local "
               "sample-level DP-SGD at each site; epsilon per round, a cap, cancel charges the rounds done.")


@hookimpl
def engine_info():
    from .schema import params_schema

    return {"name": NAME, "kinds": ["train"], "queue": "cpu", "description": DESCRIPTION,
            "params_schema": params_schema(), "federated": True}


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
    from .execute import execute

    return execute(request, dataset, data, plan, progress, workdir)
