"""The engine contract: hook specifications only (see engines/README.md)."""

import pluggy

hookspec = pluggy.HookspecMarker("privacy_engines")
hookimpl = pluggy.HookimplMarker("privacy_engines")


@hookspec
def engine_info():
    """Describe this engine: a dict with ``name``, ``kinds`` (request kinds it serves), ``queue`` ("cpu" or "gpu"), ``description`` and ``params_schema`` (a JSON schema per kind)."""


@hookspec(firstresult=True)
def plan(engine, request, dataset):
    """If ``engine`` names this plugin, validate ``request`` against ``dataset`` (a DatasetMeta) and return the Plan -- the mechanism event the run will cost -- without reading any data; raise PlanError for bad parameters; otherwise return None."""


@hookspec(firstresult=True)
def run(engine, request, dataset, data, plan, progress, workdir):
    """If ``engine`` names this plugin, compute the Release from ``data`` (a pyarrow Table of the planned columns) using only the noise ``plan`` paid for, calling ``progress`` as it goes; files the analyst may download (a model, a table) go into ``workdir`` (a pathlib.Path, empty, private to the request; an implementation may leave the argument out); otherwise return None."""


@hookspec
def prepare(engine, plan):
    """Optional. If ``engine`` names this plugin, import what ``run`` will need (torch, a solver, ...) and check that ``plan`` (None when there is none) is one this version of the engine runs (a request planned by another version of the service, queued across an upgrade); raise EngineError if not. Called before the request's data is read: such a failure (out of memory, a missing library, a plan of another version) does not depend on the data and is refunded like any failure before the read; otherwise do nothing."""
