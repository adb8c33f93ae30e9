"""The DP-VAE synthesis method: a tabular variational autoencoder trained with DP-SGD,
then sampled from its prior.

**Encoding** (the declared schema only, never a statistic of the rows): a numeric column
is clamped to its declared [lower, upper] and scaled to [-1, 1], with an "is null" input
(always there, whether or not the column has nulls: its presence must not depend on the
data); a null numeric enters as 0 with the flag set. A categorical column is one-hot over
its declared domain plus one "other/null" slot (a value outside the domain or a null).

**Model**: two ``nn.Sequential`` MLPs of Linear layers and tanh. The encoder maps a row to
the mean and log-variance of q(z|x) (``latent_dim`` each); the decoder maps z to one
softmax block per column: a categorical column's domain plus "other/null", and (the
default numeric head, ``NUMERIC_HEAD = "bins"``) a numeric column's ``bins`` equal-width
bins of its declared range plus null, the same cells MST measures. The alternative
numeric head ``"gaussian"`` outputs a value (linear, on the [-1, 1] scale), a learned
log-scale and a null logit instead. On GSS wages (10 columns) the gaussian head reached
an overall accuracy (engines/synthesis/report.py) of 0.82-0.86 and the bins head
0.95-0.96 at epsilon 1 (0.96 too without privacy, so the gap is the model, not the
noise): a Gaussian per row cannot give the skewed, heaped and integer-valued marginals of
survey columns, a softmax over bins can.

**Loss per row** (a negative ELBO, summed over rows so that each row's gradient is its
own): the cross-entropy of each softmax block; for a gaussian numeric, the Gaussian
negative log-likelihood of the scaled value (``0.5 ((x - mu) / s)^2 + log s``, skipped
when the value is null; s learned per row in [SIGMA_MIN, SIGMA_MAX]) plus the binary
cross-entropy of the null flag; plus KL(q(z|x) || N(0, I)). The reparameterisation noise
of z is torch's ordinary normal generator: it is part of the model's computation on a
row, not a release, and each row's loss (hence its clipped gradient) depends on that row
only (no batch statistic: no BatchNorm).

**Privacy** (the plan's ``subsampled_gaussian(q, z, T)``, engines/synthesis/planner.py; z
calibrated, reported and charged at the refined RDP order, as DP-SGD training's): exactly
the DP-SGD engine's step. Each of the T steps draws a Poisson sample of the
training units at rate q (``engines.dpsgd.train.Trainer._sample``), runs the encoder and
the decoder through ``engines.dpsgd.clipping.forward`` with **one shared Tape**, so that
``clipping.clipped_sum`` clips each unit's gradient over *all* parameters of both networks
to norm MAX_GRAD_NORM (1.0) in one backward pass; adds the DP-SGD engine's secure-mode
Gaussian noise (``engines.dpsgd.train._noise``, std z * C) drawn from a generator seeded
from ``os.urandom`` (``secure_generator``) to the clipped sum, divides by the expected
batch q * n (n = the public number of training units) and takes an Adam step. Nothing
else reads the rows: no data-dependent loss, statistic or early stopping is released, and
the generated table is post-processing of the noisy model.

**Privacy units**: the table ``execute`` passes holds the training rows without the unit
column. When the dataset has no unit column each row is its own unit. With a unit
column, the unit of each row is needed to clip per unit (``units`` argument or the unit
column in ``train``); without it the run is refused (clipping per row would under-charge
a unit with several rows).

**Generation**: z ~ N(0, I), decode; each block is drawn from its softmax (not the argmax);
a numeric bin becomes a value drawn uniformly inside the bin (``encoding.decode``, as MST
does), rounded down for ``integer`` columns; a gaussian numeric is its decoded value plus
its decoded Gaussian noise, clamped to the declared bounds (rounded to the nearest integer
for ``integer`` columns), null with the probability of its null logit. Numeric columns
come back as float64 (NaN = null), categorical ones as object (None = null or "other").
On CPU the run uses one intra-op thread (``_threads``).
"""

from __future__ import annotations

import math
from contextlib import contextmanager
from dataclasses import dataclass
from types import SimpleNamespace

import numpy as np
import pandas as pd
import torch
import torch.nn.functional as F
from torch import nn

from engines.dpsgd import calibrate, clipping
from engines.dpsgd.train import Trainer, _noise, device, secure_generator
from engines.types import Cancelled, EngineError

from . import encoding
from .params import Spec

MAX_GRAD_NORM = 1.0  # C: each unit's gradient (both networks together) is clipped to this L2 norm
SIGMA_MIN, SIGMA_MAX = 0.02, 1.0  # numeric noise scale on the [-1, 1] scale
LOGVAR_MIN, LOGVAR_MAX = -12.0, 6.0
ACTIVATION = nn.Tanh  # bounded activations suit DP-SGD (Papernot et al. 2021); measured: tanh >= elu > relu
PROGRESS_EVERY = 25  # steps
GENERATE_CHUNK = 65_536
TRAIN_SHARE = 0.85  # of the progress bar (execute.py writes the table at 0.9)
PHASE = "training the VAE"
NUMERIC_HEAD = "bins"  # or "gaussian" (see Layout); bins measured far better (module docstring)


# --------------------------------------------------------------------------- encoding

@dataclass
class Layout:
    """Where each declared column sits in the encoder input and the decoder output.

    ``numeric_head`` "gaussian": per numeric column the decoder outputs a value, a raw
    log-scale and a null logit; "bins": one logit per equal-width bin of the declared range
    (the column's ``bins``) plus one for null, decoded like MST's codes (uniform inside the
    bin)."""

    columns: list[dict]
    numeric_head: str = NUMERIC_HEAD

    def __post_init__(self):
        if self.numeric_head not in ("bins", "gaussian"):
            raise ValueError(f"unknown numeric head {self.numeric_head!r}")

    @property
    def numeric(self) -> list[dict]:
        return [c for c in self.columns if c["type"] == "numeric"]

    @property
    def categorical(self) -> list[dict]:
        return [c for c in self.columns if c["type"] == "categorical"]

    @property
    def slots(self) -> list[int]:
        """Softmax blocks of the decoder: binned numerics (bins + null), then each categorical
        column's domain plus "other/null"."""
        binned = [c["bins"] + 1 for c in self.numeric] if self.numeric_head == "bins" else []
        return binned + [len(c["domain"]) + 1 for c in self.categorical]

    @property
    def n_gauss(self) -> int:
        return len(self.numeric) if self.numeric_head == "gaussian" else 0

    @property
    def n_in(self) -> int:
        return 2 * len(self.numeric) + sum(len(c["domain"]) + 1 for c in self.categorical)

    @property
    def n_out(self) -> int:  # per gaussian numeric: value, raw log-scale, null logit
        return 3 * self.n_gauss + sum(self.slots)

    def encode(self, df: pd.DataFrame) -> dict[str, np.ndarray]:
        """Inputs and targets of the rows: ``x`` [n, n_in] float32, ``value`` and ``null``
        [n, numeric] float32 (value on [-1, 1], 0 where null), ``code`` [n, blocks] int64
        (the slot of each softmax block)."""
        n = len(df)
        values, nulls = [], []
        for c in self.numeric:
            x = pd.to_numeric(df[c["column"]], errors="coerce").to_numpy(dtype=np.float64, na_value=np.nan)
            null = np.isnan(x)
            lo, hi = c["lower"], c["upper"]
            v = 2.0 * (np.clip(np.where(null, lo, x), lo, hi) - lo) / (hi - lo) - 1.0
            values.append(np.where(null, 0.0, v))
            nulls.append(null.astype(np.float64))
        cat_codes = encoding.encode(df, self.categorical) if self.categorical else {}
        value = np.stack(values, 1).astype(np.float32) if values else np.zeros((n, 0), np.float32)
        null = np.stack(nulls, 1).astype(np.float32) if nulls else np.zeros((n, 0), np.float32)
        cats = [cat_codes[c["column"]] for c in self.categorical]
        parts = []
        for j in range(len(self.numeric)):
            parts += [value[:, j:j + 1], null[:, j:j + 1]]
        for j, c in enumerate(self.categorical):
            one_hot = np.zeros((n, len(c["domain"]) + 1), np.float32)
            one_hot[np.arange(n), cats[j]] = 1.0
            parts.append(one_hot)
        blocks = []
        if self.numeric_head == "bins" and self.numeric:
            num_codes = encoding.encode(df, self.numeric)
            blocks += [num_codes[c["column"]] for c in self.numeric]
        blocks += cats
        x = np.concatenate(parts, 1) if parts else np.zeros((n, 0), np.float32)
        code = np.stack(blocks, 1).astype(np.int64) if blocks else np.zeros((n, 0), np.int64)
        return {"x": x, "value": value, "null": null, "code": code}


# --------------------------------------------------------------------------- the model

class VAE(nn.Module):
    """An encoder and a decoder, both ``nn.Sequential`` of Linear layers and activations
    (what the book-keeping clipper supports)."""

    def __init__(self, layout: Layout, latent_dim: int, hidden: list[int], activation=ACTIVATION):
        super().__init__()
        self.layout, self.latent_dim = layout, latent_dim
        self.encoder = _mlp(layout.n_in, list(hidden), 2 * latent_dim, activation)
        self.decoder = _mlp(latent_dim, list(reversed(hidden)), layout.n_out, activation)

    def decode_parts(self, out: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, list[torch.Tensor]]:
        """(value, log-scale, null logit) [b, numeric] each, and the categorical logit blocks."""
        m = self.layout.n_gauss
        value, raw, null = out[:, :m], out[:, m:2 * m], out[:, 2 * m:3 * m]
        log_sigma = math.log(SIGMA_MIN) + (math.log(SIGMA_MAX) - math.log(SIGMA_MIN)) * torch.sigmoid(raw)
        blocks = list(torch.split(out[:, 3 * m:], self.layout.slots, 1)) if self.layout.slots else []
        return value, log_sigma, null, blocks

    def row_losses(self, batch: dict[str, torch.Tensor], noise: torch.Tensor | None = None,
                   tape: clipping.Tape | None = None) -> torch.Tensor:
        """The negative ELBO of each row [b] (reconstruction + KL). With ``tape`` both networks
        run through ``clipping.forward`` on that one tape (for per-unit clipping); ``noise``
        is the reparameterisation noise (default: torch's normal generator)."""
        x = batch["x"]
        h = clipping.forward(self.encoder, x, tape) if tape is not None else self.encoder(x)
        mu, logvar = h[:, :self.latent_dim], h[:, self.latent_dim:].clamp(LOGVAR_MIN, LOGVAR_MAX)
        if noise is None:
            noise = torch.randn_like(mu)
        z = mu + noise * torch.exp(0.5 * logvar)
        out = clipping.forward(self.decoder, z, tape) if tape is not None else self.decoder(z)
        value, log_sigma, null_logit, blocks = self.decode_parts(out)
        loss = torch.zeros(len(x), dtype=x.dtype, device=x.device)
        if self.layout.n_gauss:
            present = 1.0 - batch["null"]
            gauss = 0.5 * ((batch["value"] - value) * torch.exp(-log_sigma)).pow(2) + log_sigma
            loss = loss + (present * gauss).sum(1)
            loss = loss + F.binary_cross_entropy_with_logits(null_logit, batch["null"], reduction="none").sum(1)
        for j, logits in enumerate(blocks):
            loss = loss + F.cross_entropy(logits, batch["code"][:, j], reduction="none")
        kl = 0.5 * (mu.pow(2) + logvar.exp() - 1.0 - logvar).sum(1)
        return loss + kl


def _mlp(n_in: int, hidden: list[int], n_out: int, activation) -> nn.Sequential:
    layers: list[nn.Module] = []
    width = n_in
    for w in hidden:
        layers += [nn.Linear(width, w), activation()]
        width = w
    layers.append(nn.Linear(width, n_out))
    return nn.Sequential(*layers)


# --------------------------------------------------------------------------- one DP step

def _groups(units: np.ndarray, dev: torch.device) -> tuple[torch.Tensor, torch.Tensor, int]:
    """Row -> unit code (0..U-1) and the [U, k] row indices of each unit (-1 = none), the
    layout ``Trainer._sample`` and ``clipping.clipped_sum`` expect."""
    codes = np.unique(units, return_inverse=True)[1].astype(np.int64).ravel()
    n_units = int(codes.max()) + 1 if len(codes) else 0
    order = np.argsort(codes, kind="stable")
    su = codes[order]
    starts = np.searchsorted(su, np.arange(n_units))
    rank = np.arange(len(order)) - starts[su]
    k = int(rank.max()) + 1 if len(rank) else 1
    pad = np.full((n_units, k), -1, dtype=np.int64)
    pad[su, rank] = order
    return torch.from_numpy(codes).to(dev), torch.from_numpy(pad).to(dev), n_units


class DPTrainer:
    """DP-SGD on a VAE with the DP-SGD engine's sampling, clipping and noise."""

    def __init__(self, model: VAE, data: dict[str, torch.Tensor], *, q: float, z: float, expected_units: float,
                 learning_rate: float, gen: torch.Generator, units: torch.Tensor | None = None,
                 pad: torch.Tensor | None = None, n_units: int | None = None):
        self.model, self.data, self.q, self.z, self.gen = model, data, q, z, gen
        self.units, self.pad = units, pad
        self.n_units = n_units if units is not None else len(data["x"])
        self.expected = q * expected_units  # the expected batch (units): a public number
        self.params = list(model.parameters())
        self.opt = torch.optim.Adam(self.params, lr=learning_rate)
        self.steps = 0
        # Trainer._sample reads only these attributes: the same Poisson sampling of units.
        self._sampler = SimpleNamespace(q=q, gen=gen, prep=SimpleNamespace(
            x_train=data["x"], n_train_units=self.n_units, units=units, pad=pad))

    def sample(self):
        return Trainer._sample(self._sampler)

    def clipped_sum(self, rows, unit_of_row=None, pad=None, n_sel=None, noise=None) -> torch.Tensor | None:
        """Write the sum of the sampled units' clipped gradients into ``.grad``; returns the
        units' norms before clipping (None for an empty sample)."""
        if not len(rows):  # an empty Poisson sample still takes a (pure-noise) step
            for p in self.params:
                p.grad = torch.zeros_like(p)
            return None
        for p in self.params:
            p.grad = None
        tape = clipping.Tape()
        batch = {k: v[rows] for k, v in self.data.items()}
        self.model.row_losses(batch, noise, tape).sum().backward()
        norms = clipping.clipped_sum(tape, MAX_GRAD_NORM, unit_of_row, pad, n_sel if pad is not None else None)
        if any(p.grad is None for p in self.params):  # pragma: no cover - every parameter is in a recorded layer
            raise RuntimeError("a parameter of the VAE is outside the clipped layers")
        return norms

    def step(self) -> None:
        self.model.train()
        rows, unit_of_row, pad, n_sel = self.sample()
        self.clipped_sum(rows, unit_of_row, pad, n_sel)
        std = self.z * MAX_GRAD_NORM
        for p in self.params:
            p.grad.add_(_noise(std, p.grad, self.gen)).div_(self.expected)
        self.opt.step()
        self.steps += 1


# --------------------------------------------------------------------------- generation

@torch.no_grad()
def generate(model: VAE, rows: int, gen: torch.Generator) -> pd.DataFrame:
    """``rows`` rows from the prior: z ~ N(0, I), decoded and sampled (see the module docstring)."""
    model.eval()
    layout = model.layout
    dev = next(model.parameters()).device
    vals, nulls, codes = [], [], []
    for start in range(0, rows, GENERATE_CHUNK):
        m = min(GENERATE_CHUNK, rows - start)
        z = torch.randn(m, model.latent_dim, generator=gen, device=dev)
        value, log_sigma, null_logit, blocks = model.decode_parts(model.decoder(z))
        v = value + torch.exp(log_sigma) * torch.randn(value.shape, generator=gen, device=dev)
        vals.append(v.clamp(-1.0, 1.0).double().cpu())
        nulls.append((torch.rand(null_logit.shape, generator=gen, device=dev) < torch.sigmoid(null_logit)).cpu())
        codes.append(torch.stack([torch.multinomial(torch.softmax(b.double(), 1), 1, generator=gen)[:, 0]
                                  for b in blocks], 1).cpu() if blocks else torch.zeros(m, 0, dtype=torch.long))
    vals = torch.cat(vals).numpy() if vals else np.zeros((0, layout.n_gauss))
    nulls = torch.cat(nulls).numpy() if nulls else np.zeros((0, layout.n_gauss), bool)
    codes = torch.cat(codes).numpy() if codes else np.zeros((0, len(layout.slots)), np.int64)
    out: dict[str, pd.Series] = {}
    if layout.numeric_head == "bins":
        # MST's decoding: a value drawn uniformly inside its bin (the generator's bits seed numpy's)
        seed = int(torch.randint(0, 2 ** 62, (1,), generator=gen, device=dev))
        numeric = encoding.decode({c["column"]: codes[:, j] for j, c in enumerate(layout.numeric)}, layout.numeric,
                                  np.random.default_rng(seed))
        out.update({c: numeric[c] for c in numeric.columns})
        cat_codes = codes[:, len(layout.numeric):]
    else:
        for j, c in enumerate(layout.numeric):
            lo, hi = c["lower"], c["upper"]
            x = lo + (vals[:, j] + 1.0) / 2.0 * (hi - lo)
            if c.get("integer"):
                x = np.floor(x + 0.5)
            x = np.clip(x, lo, hi)
            out[c["column"]] = pd.Series(np.where(nulls[:, j], np.nan, x), dtype="float64")
        cat_codes = codes
    for j, c in enumerate(layout.categorical):
        domain = np.array(list(c["domain"]) + [None], dtype=object)
        out[c["column"]] = pd.Series(domain[cat_codes[:, j]], dtype=object)
    return pd.DataFrame({c["column"]: out[c["column"]] for c in layout.columns})


# --------------------------------------------------------------------------- the run

def _unit_ids(train: pd.DataFrame, spec: Spec, units) -> np.ndarray | None:
    if spec.unit_column is None:
        return None
    if units is None and spec.unit_column in train.columns:
        units = train[spec.unit_column].to_numpy()
    if units is None:
        raise EngineError(
            f"method vae needs each training row's privacy unit ({spec.unit_column!r}) to clip gradients per unit, "
            "and the training rows came without it: refusing rather than clipping per row (which would charge a "
            "unit with several rows too little)")
    units = np.asarray(units)
    if len(units) != len(train):
        raise EngineError("method vae: one privacy unit per training row is needed")
    return pd.factorize(pd.Series(units), use_na_sentinel=False)[0]


def synthesize(train: pd.DataFrame, spec: Spec, details: dict, progress, units=None) -> tuple[pd.DataFrame, dict]:
    """Train the DP-VAE on ``train`` with the planned q, z and steps, and sample ``spec.rows`` rows.

    ``details`` is the plan's ``details["vae"]``. ``units`` (optional): the privacy unit of
    each row of ``train``, required when the dataset has a unit column (unless ``train``
    carries that column). ``Cancelled`` from ``progress`` propagates with the event of the
    steps taken."""
    with _threads(device()):
        return _synthesize(train, spec, details, progress, units)


@contextmanager
def _threads(dev: torch.device):
    """One intra-op thread on CPU for the run (restored after): the VAE's tensors are small,
    and torch's thread hand-off costs more than their arithmetic (measured: 6 ms per step
    on one thread, 300 ms on two on a busy 2-core machine)."""
    if dev.type != "cpu":
        yield
        return
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def _synthesize(train: pd.DataFrame, spec: Spec, details: dict, progress, units) -> tuple[pd.DataFrame, dict]:
    q, z = float(details["sample_rate"]), float(details["noise_multiplier"])
    steps, per_epoch = int(details["steps"]), int(details["steps_per_epoch"])
    v = spec.vae
    unit_ids = _unit_ids(train, spec, units)
    dev = device()
    gen = secure_generator(dev)
    layout = Layout(list(spec.columns), NUMERIC_HEAD)
    enc = layout.encode(train)
    data = {k: torch.from_numpy(a).to(dev) for k, a in enc.items()}
    unit_t = pad = n_units = None
    if unit_ids is not None:
        unit_t, pad, n_units = _groups(unit_ids, dev)
    model = VAE(layout, v["latent_dim"], v["hidden"]).to(dev)
    trainer = DPTrainer(model, data, q=q, z=z, expected_units=spec.n_train_units, learning_rate=v["learning_rate"],
                        gen=gen, units=unit_t, pad=pad, n_units=n_units)
    epochs = max(1, math.ceil(steps / per_epoch))

    def report(phase, fraction, **extra):
        progress({"phase": phase, "fraction": round(min(fraction, 0.99), 4), **extra})

    try:
        report(PHASE, 0.0, epoch=1, epochs=epochs)
        for _ in range(steps):
            trainer.step()
            if trainer.steps % PROGRESS_EVERY == 0 or trainer.steps % per_epoch == 0:
                epoch = min(math.ceil(trainer.steps / per_epoch), epochs)
                report(PHASE, TRAIN_SHARE * trainer.steps / steps, epoch=epoch, epochs=epochs)
        report("generating rows", TRAIN_SHARE)
    except Cancelled as c:  # charge the steps that ran
        c.actual_event = calibrate.run_event(q, z, trainer.steps, 0.0, 0)
        raise
    synthetic = generate(model, spec.rows, gen)
    info = {"vae": {"epochs": epochs, "steps": trainer.steps, "steps_per_epoch": per_epoch, "sample_rate": q,
                    "noise_multiplier": z, "max_grad_norm": MAX_GRAD_NORM, "expected_batch_size": v["batch_size"],
                    "latent_dim": v["latent_dim"], "hidden": list(v["hidden"]), "learning_rate": v["learning_rate"],
                    "n_parameters": sum(p.numel() for p in model.parameters()), "device": dev.type}}
    return synthetic, info
