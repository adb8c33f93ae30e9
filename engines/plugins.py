"""The one plugin manager: built-in engines plus installed packages that declare the entry
point group ``privacy_engines``.

Operators can limit plugins with environment variables:

- ``PRIVACY_ENGINES_DISABLE_ENTRYPOINTS=1``: load only the built-in engines;
- ``PRIVACY_ENGINES_BLOCK=name1,name2``: never load these plugins (by plugin name).

Tests may ``pm.register(plugin)`` for one test and ``pm.unregister(plugin)`` after.
"""

from __future__ import annotations

import json
import os

import pluggy

from . import hookspecs
from .types import DatasetMeta, EngineError, EngineRequest, Plan, PlanError, Release, UnknownEngine

GROUP = "privacy_engines"
BUILTINS = ("engines.aggregates", "engines.dpsgd", "engines.synthesis", "engines.federated")

pm = pluggy.PluginManager(GROUP)
pm.add_hookspecs(hookspecs)

for _name in filter(None, os.environ.get("PRIVACY_ENGINES_BLOCK", "").split(",")):
    pm.set_blocked(_name.strip())
if os.environ.get("PRIVACY_ENGINES_DISABLE_ENTRYPOINTS", "") not in ("1", "true"):
    pm.load_setuptools_entrypoints(GROUP)
for _module in BUILTINS:
    if not pm.is_blocked(_module):
        import importlib

        pm.register(importlib.import_module(_module), name=_module)


_infos: tuple[frozenset, dict] = (frozenset(), {})


def engines() -> dict[str, dict]:
    """Every loaded engine's info, by engine name (read-only). Asked for once per set of
    registered plugins: each engine builds its parameters' schema in ``engine_info``, and
    every request asks two or three times (~0.1 ms each)."""
    global _infos
    plugins = frozenset(pm.get_plugins())  # the plugins themselves: a registered or removed one is seen
    if plugins != _infos[0]:
        out = {}
        for info in pm.hook.engine_info():
            if info and info.get("name"):
                out[info["name"]] = info
        _infos = (plugins, out)
    return _infos[1]


def info(engine: str) -> dict:
    found = engines().get(engine)
    if found is None:
        raise UnknownEngine(f"unknown engine {engine!r}; available: {', '.join(sorted(engines()))}",
                            {"engine": "unknown engine"})
    return found


def plan(engine: str, request: EngineRequest, dataset: DatasetMeta) -> Plan:
    """Ask the engine for the plan of ``request``; raises PlanError/UnknownEngine."""
    meta = info(engine)
    if request.kind not in meta["kinds"]:
        raise PlanError(f"engine {engine!r} does not serve kind {request.kind!r}; it serves: "
                        f"{', '.join(meta['kinds'])}", {"kind": "unknown kind"})
    result = pm.hook.plan(engine=engine, request=request, dataset=dataset)
    if result is None:  # pragma: no cover - an engine that lists itself but does not plan
        raise UnknownEngine(f"engine {engine!r} did not plan the request")
    return result


def prepare(engine: str, plan: Plan | None = None) -> None:
    """Load what the engine's ``run`` needs and check that it runs ``plan``'s version, before
    its data is read (the optional ``prepare`` hook); ``UnknownEngine`` if it is gone since
    planning."""
    info(engine)
    pm.hook.prepare(engine=engine, plan=plan)


def run(engine: str, request: EngineRequest, dataset: DatasetMeta, data, plan: Plan, progress,
        workdir=None) -> Release:
    """Run a planned request on its data through the engine; its files go to ``workdir``.

    ``data`` is a ``pyarrow.Table``, or for a distributed dataset an
    ``engines.distributed.PartitionedTable``: passed as it is to an engine whose info says
    ``"distributed": True``, read into one table for any other engine. For a federated
    dataset (rows at its sites) it is an ``engines.federated.Federation``, which only an
    engine whose info says ``"federated": True`` takes."""
    from engines.distributed import PartitionedTable

    if isinstance(data, PartitionedTable) and not info(engine).get("distributed"):
        data = data.to_arrow()
    info(engine)
    result = pm.hook.run(engine=engine, request=request, dataset=dataset, data=data, plan=plan, progress=progress,
                         workdir=workdir)
    if result is None:  # pragma: no cover
        raise UnknownEngine(f"engine {engine!r} did not run the request")
    _check_json(engine, result)
    return result


def _check_json(engine: str, release: Release) -> None:
    """A release is stored and hashed as strict JSON: a NaN, an infinity or a NumPy number
    in it could not be written, and the run was lost (left running until the sweep, charged
    in full, nothing released). Raised here it is the engine's failure after the read."""
    for part in ("result", "actual_event", "officer_report"):
        try:
            json.dumps(getattr(release, part), allow_nan=False)
        except (TypeError, ValueError) as e:
            raise EngineError(f"engine {engine!r} released a {part} that is not plain JSON "
                              f"({type(e).__name__}: {str(e)[:200]})") from None
