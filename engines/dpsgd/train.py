"""The DP-SGD training loop: Poisson sampling of privacy units, book-keeping clipping,
Gaussian noise, DP evaluation on a held-out split, the epsilon cap and the canary audit.

Randomness: the split, the row bounding, the Poisson sampling, the canaries' coin flips
and the noise all come from one ``torch.Generator`` seeded from ``os.urandom`` (never a
seed the analyst could know). The noise is Opacus's secure-mode sampler
(``opacus.optimizers.optimizer._generate_noise(secure_mode=True)``: each coordinate the
sum of four Gaussians of half the standard deviation, Holohan & Braghin 2021, Sec. 5.1),
the published fix to the floating-point attack on Opacus (Jin et al. 2022). OpenDP's
exact float sampler would be the stronger choice, but it draws about 2e4 samples per
second on our CPUs (0.7 s per step for a 15,000-parameter MLP), which makes DP-SGD
impractical; the released evaluation numbers, which are few, do use OpenDP (see
``evaluate``).
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field

import numpy as np
import torch
import torch.nn.functional as F

from . import calibrate, clipping, features, pld
from .intervals import ALPHA_EACH, ratio_estimate, ratio_interval
from .model_spec import build

LOSS_CAP = 5.0  # nats: per-row classification loss is clipped here for the released loss
EVAL_CHUNK = 65_536
PUBLIC_POINTS = 4096  # points of the declared domain a classifier is shown (classes_on_public_inputs)
PROGRESS_EVERY = 25  # steps


def device() -> torch.device:
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def secure_generator(dev: torch.device) -> torch.Generator:
    gen = torch.Generator(device=dev)
    gen.manual_seed(int.from_bytes(os.urandom(8), "little"))
    return gen


@dataclass
class Prepared:
    """The tensors of one request: train (with included canaries), test, canaries."""

    x_train: torch.Tensor
    y_train: torch.Tensor
    n_train_units: int  # real units + included canaries
    units: torch.Tensor | None  # row -> train unit (None: one row per unit)
    pad: torch.Tensor | None  # [units, k] row indices, -1 = none
    x_test: torch.Tensor
    y_test: torch.Tensor
    test_units: torch.Tensor
    n_test_units: int
    x_canary: torch.Tensor
    y_canary: torch.Tensor
    canary_in: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=bool))


def _random_canaries(spec, m: int, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    cols = []
    for f in spec.features:
        if f["type"] == "numeric":
            cols.append(torch.rand(m, 1, generator=gen) * 2 - 1)
        else:
            d = len(f["domain"])
            cols.append(F.one_hot(torch.randint(d, (m,), generator=gen), d).float())
    x = torch.cat(cols, 1) if cols else torch.zeros(m, 0)
    if spec.task == "regression":
        y = torch.rand(m, generator=gen)
    elif spec.task == "binary":
        y = torch.randint(2, (m,), generator=gen).float()
    else:
        y = torch.randint(len(spec.target["classes"]), (m,), generator=gen)
    return x, y


def prepare(table, spec, gen: torch.Generator, dev: torch.device, canaries: int | None = None) -> Prepared:
    """Tensors on ``dev`` from the rows; ``gen`` (a CPU generator) draws the held-out split,
    the rows kept per unit, the canaries and their coin flips. ``canaries`` overrides the
    spec's number (data-parallel ranks other than 0 hold none: each canary is trained on
    once, by one rank)."""
    x = features.encode_features(table, spec.features)
    y, ok = features.encode_target(table, spec.task, spec.target)
    units = features.unit_codes(table, spec.unit_column)
    x, y, units = x[ok], y[ok], units[ok]
    units = np.unique(units, return_inverse=True)[1].astype(np.int64)
    n_units = int(units.max()) + 1 if len(units) else 0
    n_test = int(round(n_units * spec.test_fraction))
    perm = torch.randperm(n_units, generator=gen).numpy()
    is_test_unit = np.zeros(n_units, dtype=bool)
    is_test_unit[perm[:n_test]] = True
    test_rows = is_test_unit[units]
    train_idx = np.nonzero(~test_rows)[0]
    test_idx = np.nonzero(test_rows)[0]
    grouped = spec.unit_column is not None

    # Train rows: each unit keeps at most k of its rows, chosen at random.
    tr_units = np.unique(units[train_idx], return_inverse=True)[1].astype(np.int64)
    n_real = int(tr_units.max()) + 1 if len(tr_units) else 0
    k = spec.max_rows_per_unit if grouped else 1
    if grouped:
        shuffle = torch.randperm(len(train_idx), generator=gen).numpy()
        order = shuffle[np.argsort(tr_units[shuffle], kind="stable")]
        su = tr_units[order]
        starts = np.searchsorted(su, np.arange(n_real))
        rank = np.arange(len(order)) - starts[su]
        keep = order[rank < k]
        train_idx, tr_units = train_idx[keep], tr_units[keep]
    xt, yt = x[train_idx], y[train_idx]

    m = spec.canaries if canaries is None else canaries
    xc, yc = _random_canaries(spec, m, gen)
    canary_in = (torch.rand(m, generator=gen) < 0.5).numpy()
    inc = np.nonzero(canary_in)[0]
    x_train = torch.cat([torch.from_numpy(xt), xc[inc]])
    y_train = torch.cat([torch.from_numpy(yt), yc[inc].to(torch.from_numpy(yt).dtype)])
    n_train_units = n_real + len(inc)
    units_t = pad = None
    if grouped:
        all_units = np.concatenate([tr_units, n_real + np.arange(len(inc))])
        units_t = torch.from_numpy(all_units)
        order = np.argsort(all_units, kind="stable")
        su = all_units[order]
        starts = np.searchsorted(su, np.arange(n_train_units))
        rank = np.arange(len(order)) - starts[su]
        pad_np = np.full((n_train_units, k), -1, dtype=np.int64)
        pad_np[su, rank] = order
        pad = torch.from_numpy(pad_np).to(dev)
        units_t = units_t.to(dev)
    test_units = np.unique(units[test_idx], return_inverse=True)[1].astype(np.int64)
    return Prepared(
        x_train=x_train.to(dev), y_train=y_train.to(dev), n_train_units=n_train_units, units=units_t, pad=pad,
        x_test=torch.from_numpy(x[test_idx]).to(dev), y_test=torch.from_numpy(y[test_idx]).to(dev),
        test_units=torch.from_numpy(test_units).to(dev), n_test_units=max(n_test, 1),
        x_canary=xc.to(dev), y_canary=yc.to(dev), canary_in=canary_in)


def row_losses(task: str, out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    if task == "binary":
        return F.binary_cross_entropy_with_logits(out.squeeze(1), y, reduction="none")
    if task == "multiclass":
        return F.cross_entropy(out, y, reduction="none")
    return (out.squeeze(1) - y).pow(2)


def _optimizer(spec, model):
    if spec.optimizer == "sgd":
        return torch.optim.SGD(model.parameters(), lr=spec.learning_rate, momentum=spec.momentum,
                               weight_decay=spec.weight_decay)
    cls = torch.optim.AdamW if spec.optimizer == "adamw" else torch.optim.Adam
    return cls(model.parameters(), lr=spec.learning_rate, weight_decay=spec.weight_decay)


def _noise(std: float, like: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
    from opacus.optimizers.optimizer import _generate_noise

    return _generate_noise(std, like, generator=gen, secure_mode=True)


class Trainer:
    """One training run (one model). ``z`` None trains without privacy (a baseline).
    ``group`` (``parallel.Group``): this is one rank of a data-parallel run, ``prep`` its
    share of the units; the noise is added once over all ranks (``parallel``)."""

    def __init__(self, spec, prep: Prepared, *, q: float, z: float | None, steps_per_epoch: int,
                 gen: torch.Generator, eval_noise=None, eval_epsilon_each: float = 0.0, final_noise=None,
                 final_epsilon: float = 0.0, group=None):
        self.spec, self.prep, self.q, self.z = spec, prep, q, z
        self.steps_per_epoch = steps_per_epoch
        self.gen = gen
        # per-epoch evaluations (``eval_noise``) and the final one (``final_noise``: the
        # result's metric; None in a plan made before it existed, whose last epoch's
        # evaluation is the result's, as in a non-private run)
        self.eval_noise, self.eval_epsilon_each = eval_noise, eval_epsilon_each
        self.final_noise, self.final_epsilon = (final_noise, final_epsilon) if z is not None else (None, 0.0)
        self.final: dict | None = None  # the final evaluation's metrics, once released
        self.model = build(spec.layers).to(prep.x_train.device)
        self.group = group
        if group is not None:
            group.broadcast_model(self.model)
        self.opt = _optimizer(spec, self.model)
        self.steps = 0
        self.evals = 0
        self.history: list[dict] = []

    # ------------------------------------------------------------------ accounting
    def _final(self, final: bool | None) -> float:
        return self.final_epsilon if (self.final is not None if final is None else final) else 0.0

    def event(self, steps: int | None = None, evals: int | None = None, final: bool | None = None) -> dict:
        """The event of the steps and evaluations taken (or of those given: ``final``, the
        final evaluation's)."""
        return calibrate.run_event(self.q, self.z, self.steps if steps is None else steps, self.eval_epsilon_each,
                                   self.evals if evals is None else evals, self._final(final))

    def epsilon(self, steps: int | None = None, evals: int | None = None, final: bool | None = None) -> float:
        if self.z is None:
            return math.inf
        # the run's certificate: by the accountant that calibrated it (pld or the ledger's rdp)
        return pld.certifier(getattr(self.spec, "accountant", "rdp"))(
            self.q, self.z, self.steps if steps is None else steps, self.eval_epsilon_each,
            self.evals if evals is None else evals, self.spec.delta, final=self._final(final))

    # ------------------------------------------------------------------ one step
    def _sample(self) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None, int]:
        p = self.prep
        dev = p.x_train.device
        mask = torch.rand(p.n_train_units, generator=self.gen, device=dev) < self.q
        sel = mask.nonzero().flatten()
        if p.units is None:
            return sel, None, None, len(sel)
        rows_pad = p.pad[sel]
        valid = rows_pad >= 0
        rows = rows_pad[valid]
        s, k = rows_pad.shape
        unit_of_row = torch.arange(s, device=dev)[:, None].expand(s, k)[valid]
        pad = torch.full((s, k), -1, dtype=torch.long, device=dev)
        pad[valid] = torch.arange(len(rows), device=dev)
        return rows, unit_of_row, pad, s

    def step(self) -> None:
        p, spec = self.prep, self.spec
        rows, unit_of_row, pad, n_sel = self._sample()
        params = [q for q in self.model.parameters()]
        self.model.train()
        if self.z is None:  # non-private baseline: plain mini-batch gradient
            self.opt.zero_grad(set_to_none=False)
            if len(rows):
                out = self.model(p.x_train[rows])
                loss = row_losses(spec.task, out, p.y_train[rows]).sum()
                (loss if self.group is not None else loss / max(len(rows), 1)).backward()
            if self.group is not None:
                for prm in params:
                    if prm.grad is None:
                        prm.grad = torch.zeros_like(prm)
                self.group.mean(params, len(rows))
            self.opt.step()
            self.steps += 1
            return
        if len(rows):
            tape = clipping.Tape()
            out = clipping.forward(self.model, p.x_train[rows], tape)
            row_losses(spec.task, out, p.y_train[rows]).sum().backward()
            clipping.clipped_sum(tape, spec.max_grad_norm, unit_of_row, pad, n_sel if pad is not None else None)
        else:  # an empty Poisson batch still takes a (pure-noise) step
            for prm in params:
                prm.grad = torch.zeros_like(prm)
        std = self.z * spec.max_grad_norm
        # The expected batch from public counts only: the number of rows with a usable
        # target (p.n_train_units) depends on the private data.
        expected = self.q * (spec.n_train_units + spec.canaries / 2)
        if self.group is not None:  # once over all ranks, then the same divisor
            self.group.noisy_mean(params, std, expected, lambda sd, like: _noise(sd, like, self.gen))
        else:
            for prm in params:
                prm.grad.add_(_noise(std, prm.grad, self.gen)).div_(expected)
        self.opt.step()
        self.steps += 1

    # ------------------------------------------------------------------ evaluation
    @torch.no_grad()
    def _exact_metrics(self) -> tuple[float, float, float]:
        """Over held-out units: the sums of each unit's mean metric and mean loss (both in
        [0, 1]) and the number of units."""
        p, task = self.prep, self.spec.task
        if len(p.x_test) == 0:  # e.g. a data-parallel rank holding too few units for a held-out share
            return 0.0, 0.0, 0.0
        self.model.eval()
        metric, loss = [], []
        for i in range(0, len(p.x_test), EVAL_CHUNK):
            out = self.model(p.x_test[i:i + EVAL_CHUNK])
            y = p.y_test[i:i + EVAL_CHUNK]
            if task == "regression":
                pred = out.squeeze(1).clamp(0, 1)
                metric.append((pred - y).abs())
                loss.append((pred - y).pow(2))
            else:
                pred = (out.squeeze(1) > 0).float() if task == "binary" else out.argmax(1)
                metric.append((pred == y).float())
                loss.append(row_losses(task, out, y).clamp(max=LOSS_CAP) / LOSS_CAP)
        # a non-finite output (a diverged model) scores the worst: each unit's metric and loss
        # stay in [0, 1], which the noise's sensitivity (3) assumes
        metric = torch.nan_to_num(torch.cat(metric).double(), nan=1.0 if task == "regression" else 0.0)
        loss = torch.nan_to_num(torch.cat(loss).double(), nan=1.0)
        counts = torch.bincount(p.test_units, minlength=p.n_test_units).double()
        per_unit_metric = torch.bincount(p.test_units, weights=metric, minlength=p.n_test_units) / counts.clamp(min=1)
        per_unit_loss = torch.bincount(p.test_units, weights=loss, minlength=p.n_test_units) / counts.clamp(min=1)
        return float(per_unit_metric.sum()), float(per_unit_loss.sum()), float((counts >= 1).sum())

    def classes_on_public_inputs(self, n: int = PUBLIC_POINTS) -> dict | None:
        """A classifier's predicted classes on ``n`` points of the declared domain
        (``features.random_inputs``: public, so this costs no budget): a model that
        predicts one class on all of them says so, whatever its accuracy reads (the
        majority's share, on a rare positive). None for a regression."""
        if self.spec.task == "regression":
            return None
        dev = next(self.model.parameters()).device  # (a data-parallel rank's run comes back detached: no prep)
        x = torch.from_numpy(features.random_inputs(self.spec.features, n)).to(dev)
        self.model.eval()
        with torch.no_grad():
            out = self.model(x)
        if not torch.isfinite(out).all():
            return {"points": n, "classes_predicted": None, "most_predicted_share": None}
        pred = (out.squeeze(1) > 0).long() if self.spec.task == "binary" else out.argmax(1)
        counts = torch.bincount(pred.cpu())
        return {"points": n, "classes_predicted": int((counts > 0).sum()),
                "most_predicted_share": float(counts.max()) / n}

    def evaluate(self, final: bool = False) -> dict:
        """Held-out metric and loss, released with OpenDP Laplace noise (or exact for a
        non-private baseline): the noisy sums over units divided by the noisy number of
        units (how many held-out units have a usable target depends on the data, so it is
        released too). A unit moves each of the three by at most 1: L1 sensitivity 3.
        A private metric comes with its 95% interval (``intervals.ratio_interval``); metric
        and loss are None when the released count of usable units is within its 95% noise
        bound of zero (post-processing of the released values). ``final``: the final
        evaluation, with its own noise (``final_noise``), kept as ``self.final``."""
        noise = self.final_noise if final else self.eval_noise
        if self.z is not None and noise is None:
            return {}
        values = self._exact_metrics()
        if self.group is not None:  # every rank's held-out units, released once by rank 0
            values = self.group.sum_values(list(values))
            if self.z is not None:
                released = noise.release(list(values)) if self.group.rank == 0 else None
                values = self.group.from_rank0(released, len(values))
        elif self.z is not None:
            values = noise.release(list(values))
        if not final:
            self.evals += 1
        metrics = self._metrics(values, noise.halfwidth(ALPHA_EACH) if self.z is not None else None)
        if final:
            self.final = metrics
        return metrics

    def _metrics(self, values, t: float | None) -> dict:
        """The released metric and loss from the released (or exact) sums; ``t``: the 95%
        bound of their noise (None: exact)."""
        metric_sum, loss_sum, n_released = values
        # the metric and loss (None when the units, as released, are within the noise of
        # none) and the metric's 95% interval from the noise (post-processing: ``intervals``)
        metric, loss = (ratio_estimate(v, n_released, t) for v in (metric_sum, loss_sum))
        # each with its interval: a noisy sum below zero is released as 0 (a loss of 0.0 on
        # random labels), which its interval shows for what it is
        ci, loss_ci = ((ratio_interval(v, n_released, t) if t is not None else None) for v in (metric_sum, loss_sum))
        # the held-out units with a usable target, as released (the plan's stated half-width
        # assumes every declared held-out unit has one; fewer widen the interval)
        units = {"val_units": max(round(n_released), 0)}  # (a noisy count: clamped at 0, post-processing)
        if self.spec.task == "regression":
            span = self.spec.target["upper"] - self.spec.target["lower"]
            return {"val_mae": None if metric is None else metric * span, "val_mse_scaled": loss, **units,
                    **({"val_mae_ci95": [v * span for v in ci], "val_mse_scaled_ci95": loss_ci} if ci else {})}
        return {"val_accuracy": metric, "val_loss": None if loss is None else loss * LOSS_CAP, **units,
                **({"val_accuracy_ci95": ci, "val_loss_ci95": [v * LOSS_CAP for v in loss_ci]} if ci else {})}

    # ------------------------------------------------------------------ the run
    def fit(self, epochs: int, progress, *, label: str = "", max_epsilon: float | None = None,
            patience: int | None = None, base_fraction: float = 0.0, span: float = 1.0) -> str:
        """Train up to ``epochs``; returns why it stopped (completed, max_epsilon, early_stopping,
        diverged: a weight is no longer finite, so further steps cannot mend it).
        ``Cancelled`` from ``progress`` propagates; ``event()`` is then what was spent."""
        with_eval = self.z is None or self.eval_noise is not None
        has_final = self.final_noise is not None  # else the last epoch's evaluation is the result's
        best, since = -math.inf, 0
        total = epochs * self.steps_per_epoch
        for epoch in range(1, epochs + 1):
            last = epoch == epochs and has_final
            if max_epsilon is not None:  # this epoch, its evaluation and the final one
                nxt = self.epsilon(self.steps + self.steps_per_epoch, self.evals + int(with_eval and not last),
                                   final=has_final)
                if nxt > max_epsilon:
                    return self._stop("max_epsilon")
            for s in range(self.steps_per_epoch):
                self.step()
                if s % PROGRESS_EVERY == 0:
                    progress(self._progress(label, base_fraction + span * self.steps / total))
            row = {"epoch": epoch, "steps": self.steps, **self.evaluate(final=last)}
            row["epsilon"] = self.epsilon() if self.z is not None else None
            self.history.append(row)
            progress(self._progress(label, base_fraction + span * self.steps / total))
            if not all(bool(torch.isfinite(prm).all()) for prm in self.model.parameters()):
                return "diverged"  # (this epoch's evaluation, the worst metric, is the result's)
            metric = row.get("val_accuracy", row.get("val_mae"))
            score = None if metric is None else metric if "val_accuracy" in row else -metric
            if patience is not None and with_eval and score is not None and not last:
                if score > best:
                    best, since = score, 0
                else:
                    since += 1
                    if since >= patience:
                        return self._stop("early_stopping")
        return "completed"

    def _stop(self, reason: str) -> str:
        """A run stopped before its last epoch: the final evaluation of the model it releases."""
        if self.final_noise is not None and self.final is None:
            self.evaluate(final=True)
        return reason

    def detached(self) -> Trainer:
        """This run without its data, generators, optimizer and group: what a data-parallel
        rank sends back (the model on CPU, the history, the steps and evaluations spent)."""
        self.model = self.model.cpu()
        self.prep = self.gen = self.opt = self.group = None
        return self

    def _progress(self, label: str, fraction: float) -> dict:
        out = {"phase": f"training{' ' + label if label else ''}", "fraction": round(min(fraction, 0.99), 4),
               "steps": self.steps, "epsilon_spent": self.epsilon() if self.z is not None else None,
               "epochs": self.history}
        return out

    @torch.no_grad()
    def canary_losses(self) -> np.ndarray:
        self.model.eval()
        p = self.prep
        return row_losses(self.spec.task, self.model(p.x_canary), p.y_canary).double().cpu().numpy()
