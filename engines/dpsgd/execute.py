"""A run: prepare tensors, train each planned model, evaluate, audit, save, report.

Files written to ``workdir`` (the host serves them to the analyst who asked):
``model.pt`` (``torch.save`` of ``{"format", "layers", "state_dict", "preprocessing"}``,
loadable with ``torch.load(..., weights_only=True)``), ``preprocessing.json``; a sweep
writes ``model-eps<e>.pt`` per run, ``sweep.png`` and ``sweep.csv``.
"""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path

import torch

from engines.types import Cancelled, DatasetMeta, EngineRequest, Plan, Release, before_the_first_step

from . import audit, features
from .params import Spec
from .planner import DETAILS_VERSION
from .train import Trainer, device, prepare, secure_generator

MODEL_FORMAT = "governance.dpsgd/1"


def _save_model(trainer: Trainer, spec: Spec, path: Path) -> None:
    state = {k: v.detach().cpu() for k, v in trainer.model.state_dict().items()}
    torch.save({"format": MODEL_FORMAT, "layers": spec.layers, "state_dict": state,
                "preprocessing": features.preprocessing(spec)}, path)


def _finite(x):
    return x if x is not None and math.isfinite(x) else None


def _run_result(trainer: Trainer, run: dict, reason: str, planned_steps: int, audit_result: dict | None) -> dict:
    # the final evaluation's metrics (the last epoch's in a plan without one, or a diverged run)
    last = trainer.final if trainer.final is not None else trainer.history[-1] if trainer.history else {}
    test = {k: v for k, v in last.items() if k.startswith("val_")}
    return {
        "label": run["label"] or None,
        "noise_multiplier": run["noise_multiplier"],
        "target_epsilon": run["target_epsilon"],
        "epsilon_spent": _finite(trainer.epsilon()),
        "certified_by": run.get("certified_by", "rdp"),  # the accountant of epsilon_spent and target_epsilon
        "planned_epsilon": run["planned_epsilon"],
        "steps": trainer.steps,
        "planned_steps": planned_steps,
        "epochs_completed": len(trainer.history),
        "stopped": reason,
        "test": {k.removeprefix("val_"): v for k, v in test.items()},
        # a classifier's predictions on points of the declared domain (no data: no budget);
        # one class on all of them is a model that predicts one class, whatever its accuracy
        "public_inputs": trainer.classes_on_public_inputs(),
        "eval_ci95_halfwidth": run.get("eval_ci95_halfwidth"),  # what the plan stated
        "history": trainer.history,
        "audit": audit_result,
    }


def _plot(rows: list[dict], metric: str, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4), dpi=110)
    pts = [(r["target_epsilon"], r["test"].get(metric)) for r in rows if r["target_epsilon"] is not None]
    pts = [(e, v) for e, v in pts if v is not None]
    if pts:
        ax.plot([e for e, _ in pts], [v for _, v in pts], "o-", label="DP-SGD")
    for r in rows:
        if r["target_epsilon"] is None and r["test"].get(metric) is not None:
            ax.axhline(r["test"][metric], ls="--", color="grey", label="non-private baseline")
    ax.set_xscale("log")
    ax.set_xlabel("epsilon")
    ax.set_ylabel(f"held-out {metric} (DP estimate)")
    ax.set_title("Privacy-utility sweep")
    ax.grid(True, alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, format="png")
    plt.close(fig)


def train_runs(spec: Spec, d: dict, prep, gen: torch.Generator, progress, group=None) -> tuple[list, list]:
    """Train every planned run on ``prep``: ``(trainers, [(why it stopped, audit result)])``.
    With ``group`` this is one rank of a data-parallel run (``parallel``): every rank
    trains the same replicas; rank 0, which holds the canaries, audits. A ``Cancelled``
    from ``progress`` propagates with ``actual_event``: the steps and evaluations spent."""
    from engines.aggregates.noise import Noise

    runs, trainers, outcomes = d["runs"], [], []
    try:
        for i, run in enumerate(runs):
            eval_noise = Noise.from_dict(run["eval_noise"]) if run["eval_noise"] else None
            final_noise = Noise.from_dict(run["final_eval_noise"]) if run.get("final_eval_noise") else None
            trainer = Trainer(spec, prep, q=d["sample_rate"], z=run["noise_multiplier"],
                              steps_per_epoch=d["steps_per_epoch"], gen=gen, eval_noise=eval_noise,
                              eval_epsilon_each=run["eval_epsilon_each"], final_noise=final_noise,
                              final_epsilon=run.get("final_eval_epsilon", 0.0), group=group)
            trainers.append(trainer)
            reason = trainer.fit(spec.epochs, progress, label=run["label"] and f"epsilon {run['label']}",
                                 max_epsilon=spec.max_epsilon, patience=spec.early_stopping_patience,
                                 base_fraction=i / len(runs), span=1 / len(runs))
            progress({"phase": f"auditing{' epsilon ' + run['label'] if run['label'] else ''}",
                      "fraction": round((i + 0.99) / len(runs), 4)})
            audit_result = None
            if spec.canaries and (group is None or group.rank == 0):
                audit_result = audit.audit(trainer.canary_losses(), prep.canary_in, spec.delta,
                                           _finite(trainer.epsilon()))
            outcomes.append((reason, audit_result))
    except Cancelled as c:  # charge the steps and evaluations that ran, in every run so far
        spent = [t.event() for t in trainers]
        c.actual_event = spent[0] if len(spent) == 1 else {"kind": "composed", "events": spent}
        raise
    except Exception as e:  # e.g. a collective failed (a rank died): the step or evaluation under way counts
        if trainers:  # as taken, the final evaluation too (engines/distributed/training.py charges it if the run
            last, run = trainers[-1], runs[len(trainers) - 1]  # fails for that)
            spent = [t.event() for t in trainers[:-1]] + [
                last.event(min(last.steps + 1, d["steps"]), min(last.evals + 1, run["evals"]), final=True)]
            e.actual_event = spent[0] if len(spent) == 1 else {"kind": "composed", "events": spent}
        raise
    return trainers, outcomes


def execute(request: EngineRequest, dataset: DatasetMeta, data, plan: Plan, progress, workdir) -> Release:
    d = check_version(plan)
    spec = Spec.from_dict(d["spec"])
    dev = device()
    gen = secure_generator(dev)  # sampling and noise, on the training device
    with before_the_first_step():
        progress({"phase": "preparing data", "fraction": 0.0})
        prep = prepare(data, spec, secure_generator(torch.device("cpu")), dev)  # split, bounding, canaries
    trainers, outcomes = train_runs(spec, d, prep, gen, progress)
    return finish(spec, d, trainers, outcomes, Path(workdir), dev.type)


def check_version(plan: Plan) -> dict:
    d = plan.details_of("dpsgd", DETAILS_VERSION)
    return d


def finish(spec: Spec, d: dict, trainers: list, outcomes: list, workdir: Path, device_type: str) -> Release:
    """The release of trained runs: model files in ``workdir``, the result, the spent event
    when a run stopped before its plan."""
    runs, planned_steps = d["runs"], d["steps"]
    events, results = [], []
    for trainer, run, (reason, audit_result) in zip(trainers, runs, outcomes):
        events.append(trainer.event())
        name = "model.pt" if spec.kind == "train" else f"model-eps{run['label']}.pt"
        _save_model(trainer, spec, workdir / name)
        results.append({**_run_result(trainer, run, reason, planned_steps, audit_result), "model_file": name})

    (workdir / "preprocessing.json").write_text(json.dumps(features.preprocessing(spec), indent=2))
    common = {"task": spec.task, "target": spec.target["column"], "features": [f["column"] for f in spec.features],
              "model": d["model"], "n_parameters": d["n_parameters"], "model_fixes": d["model_fixes"],
              "sample_rate": d["sample_rate"], "expected_batch_size": spec.batch_size,
              "max_grad_norm": spec.max_grad_norm, "delta": spec.delta,
              # public counts (from the dataset's n_units): the exact counts of usable rows would leak
              "train_units": spec.n_train_units, "test_units": spec.n_test_units, "device": device_type,
              "metrics_note": "held-out metrics are DP estimates (OpenDP Laplace noise), charged with the run"}
    metric = "mae" if spec.task == "regression" else "accuracy"
    if spec.kind == "train":
        r = results[0]
        t = trainers[0]
        short = t.steps < planned_steps or t.evals < runs[0]["evals"] or (t.final_noise is not None and t.final is None)
        actual = events[0] if short else None
        return Release(result={**common, **r}, actual_event=actual)
    _plot(results, metric, workdir / "sweep.png")
    with open(workdir / "sweep.csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["epsilon", "noise_multiplier", "epsilon_spent", f"test_{metric}", "audit_epsilon_lower_bound"])
        for r in results:
            w.writerow([r["label"], r["noise_multiplier"], r["epsilon_spent"], r["test"].get(metric),
                        (r["audit"] or {}).get("empirical_epsilon_lower_bound")])
    table = [{"epsilon": r["label"], "noise_multiplier": r["noise_multiplier"], "epsilon_spent": r["epsilon_spent"],
              f"test_{metric}": r["test"].get(metric),
              "audit_epsilon_lower_bound": (r["audit"] or {}).get("empirical_epsilon_lower_bound")} for r in results]
    shrunk = any(r["steps"] < planned_steps for r in results)
    return Release(result={**common, "table": table, "runs": results, "plot": "sweep.png"},
                   actual_event={"kind": "composed", "events": events} if shrunk else None)
