"""A small engine registered for these tests only (Celery runs eagerly: tests/conftest.py)."""

import pyarrow.compute as pc
import pytest

from engines import plugins
from engines.hookspecs import hookimpl
from engines.types import Plan, PlanError, Release


class ProbeEngine:
    """Counts rows (no noise: a test double of the flow, never a release engine).

    kinds: ``count`` (costs Laplace(epsilon)), ``fail`` (raises after reading the data),
    ``stepwise`` (reports progress, so a cancellation can land mid-run; commits less than planned),
    ``file`` (writes a file for the analyst, as a model or a table), ``nan`` (a result
    that is not strict JSON: a loss that diverged).
    """

    NAME = "probe"

    @hookimpl
    def engine_info(self):
        return {"name": self.NAME, "kinds": ["count", "fail", "stepwise", "file", "nan"], "queue": "cpu",
                "description": "test engine", "params_schema": {}}

    @hookimpl
    def plan(self, engine, request, dataset):
        if engine != self.NAME:
            return None
        eps = request.params.get("epsilon")
        if not isinstance(eps, (int, float)) or eps <= 0:
            raise PlanError("epsilon must be > 0", {"epsilon": "must be > 0"})
        if request.kind == "stepwise":
            event = {"kind": "self_composed", "event": {"kind": "laplace", "epsilon": eps}, "count": 4}
        else:
            event = {"kind": "laplace", "epsilon": eps}
        if request.params.get("non_private"):  # with a non-private baseline, as a DP-SGD sweep's
            event = {"kind": "composed", "events": [event, {"kind": "non_private"}]}
        return Plan(event=event, columns=["age"], details={"epsilon": eps})

    @hookimpl
    def run(self, engine, request, dataset, data, plan, progress, workdir):
        if engine != self.NAME:
            return None
        if request.kind == "file":
            (workdir / "rows.txt").write_text(str(data.num_rows))
        progress({"phase": "counting", "fraction": 0.5})
        if request.kind == "fail":
            raise RuntimeError(f"secret value {pc.max(data.column('age')).as_py()}")
        if request.kind == "nan":
            return Release(result={"loss": float("nan"), "history": [float("inf")]})
        if request.kind == "stepwise":
            for step in range(2):
                progress({"phase": "step", "step": step, "fraction": step / 4})
            return Release(result={"steps": 2},
                           actual_event={"kind": "self_composed", "event": {"kind": "laplace",
                                                                             "epsilon": plan.details["epsilon"]},
                                         "count": 2})
        return Release(result={"rows": data.num_rows})


@pytest.fixture(autouse=True)
def probe_engine():
    engine = ProbeEngine()
    plugins.pm.register(engine, name="probe-engine")
    yield engine
    plugins.pm.unregister(engine)


@pytest.fixture
def cancel_as_the_engine_starts(monkeypatch):
    """Every run is asked to cancel as its engine starts: the rows read, handed to it."""
    from governance.models import Request

    real = plugins.run

    def asked_during_the_run(engine, *args, **kwargs):
        Request.objects.filter(engine=engine).update(cancel_requested=True)
        return real(engine, *args, **kwargs)

    monkeypatch.setattr(plugins, "run", asked_during_the_run)
