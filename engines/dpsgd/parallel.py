"""Data-parallel DP-SGD: the ranks of one training run and what they exchange.

Each rank holds a disjoint share of the privacy units (``engines.distributed.training``
deals them out), Poisson-samples its own units at the plan's rate ``q`` with its own
secure generator (the union is a Poisson sample of all units at rate ``q``: the event the
accountant was given, whatever the number of ranks), and clips each sampled unit's
gradient to ``C`` as a single-process run does. Then, as Opacus's
``DistributedDPOptimizer`` (opacus/optimizers/ddpoptimizer.py):

* **rank 0 alone** adds the Gaussian noise, ``N(0, (z C)^2)`` per coordinate from the
  same secure-mode sampler as a single-process run, to its clipped sum; the other ranks
  add none (Opacus: ``add_noise`` only ``if self.rank == 0``);
* the ranks' sums are added by an all-reduce (``SUM``), so every rank holds
  ``sum of every rank's clipped gradients + one noise draw``;
* every rank divides by the **global** expected batch ``q * n`` (from public counts), the
  divisor of a single-process run. Opacus divides each rank by its own expected batch and
  the all-reduced sum by the world size: the same ``q * n`` in total.

So the averaged update carries noise of standard deviation exactly ``z C / (q n)``: not
``sqrt(N)`` times too much (every rank adding its own draw) nor too little (each adding
``1/sqrt(N)`` of it). tests/dpsgd/test_parallel.py measures it on ranks whose clipped sums
are zero. The model starts equal on every rank (rank 0's initial weights are broadcast,
as Opacus's ``DifferentiallyPrivateDistributedDataParallel`` does), every rank applies the
same all-reduced gradient with the same optimizer, so the replicas stay equal.

Held-out evaluation: the ranks' exact sums are all-reduced and rank 0 releases them once
through the plan's OpenDP measurement, then broadcasts the released values.

The group is a ``torch.distributed`` process group built directly on a ``TCPStore``
(gloo on CPU, NCCL for CUDA tensors), not the process-wide default group: a Dask worker
process may serve other tasks, and nothing global is left behind when the run ends.
"""

from __future__ import annotations

import datetime

import torch
import torch.distributed as dist

__all__ = ["Group", "backend_for", "connect"]


def backend_for(dev: torch.device) -> str:
    return "nccl" if dev.type == "cuda" and dist.is_nccl_available() else "gloo"


class Group:
    """The ranks of one run: collectives over ``pg`` (a ``torch.distributed`` process
    group), on tensors of ``dev``."""

    def __init__(self, pg, rank: int, size: int, dev: torch.device, store=None):
        self.pg, self.rank, self.size, self.dev = pg, rank, size, dev
        self._store = store  # kept alive: rank 0 serves it

    def _allreduce(self, tensors: list[torch.Tensor]) -> None:
        """Sum each tensor over the ranks, in place: one collective on a flat copy (a list
        given to ``ProcessGroup.allreduce`` means one tensor per device, not many tensors)."""
        if len(tensors) == 1:
            self.pg.allreduce([tensors[0]]).wait()
            return
        flat = torch.cat([t.reshape(-1) for t in tensors])
        self.pg.allreduce([flat]).wait()
        at = 0
        for t in tensors:
            t.copy_(flat[at:at + t.numel()].view_as(t))
            at += t.numel()

    def broadcast_model(self, model: torch.nn.Module) -> None:
        """Every rank starts from rank 0's parameters and buffers."""
        with torch.no_grad():
            for t in list(model.parameters()) + list(model.buffers()):
                self.pg.broadcast([t.data]).wait()

    def noisy_mean(self, params: list[torch.Tensor], std: float, expected: float, noise) -> None:
        """``p.grad`` holds this rank's clipped sum; afterwards it holds
        ``(sum over ranks + one N(0, std^2) draw) / expected`` on every rank. ``noise(std,
        like)`` draws the Gaussian (called on rank 0 only)."""
        grads = [p.grad for p in params]
        if self.rank == 0:
            for g in grads:
                g.add_(noise(std, g))
        self._allreduce(grads)
        for g in grads:
            g.div_(expected)

    def mean(self, params: list[torch.Tensor], count: int) -> None:
        """Non-private baseline: ``p.grad`` holds this rank's sum over its ``count`` rows;
        afterwards the mean over every rank's rows."""
        n = self.sum_values([float(count)])[0]
        self._allreduce([p.grad for p in params])
        for p in params:
            p.grad.div_(max(n, 1.0))

    def sum_values(self, values: list[float]) -> list[float]:
        t = torch.tensor(values, dtype=torch.float64, device=self.dev)
        self._allreduce([t])
        return t.tolist()

    def from_rank0(self, values: list[float] | None, n: int) -> list[float]:
        """Rank 0's ``values`` (``n`` numbers) on every rank."""
        t = torch.tensor(values if self.rank == 0 else [0.0] * n, dtype=torch.float64, device=self.dev)
        self.pg.broadcast([t]).wait()
        return t.tolist()

    def any(self, flag: bool) -> bool:
        """Whether any rank's ``flag`` is set (every rank gets the answer)."""
        t = torch.tensor([1.0 if flag else 0.0], dtype=torch.float64, device=self.dev)
        self._allreduce([t])
        return bool(t.item() > 0)


def connect(rank: int, size: int, host: str, port: int | None, dev: torch.device, *, publish=None,
            timeout_s: float = 600.0) -> Group:
    """Join the run's group. Rank 0 serves the rendezvous store on ``host`` (port chosen
    by the OS) and hands its port to ``publish(port)``; the other ranks connect to
    ``host:port``. ``timeout_s`` bounds every collective (a rank that died fails the others)."""
    timeout = datetime.timedelta(seconds=timeout_s)
    if rank == 0:
        store = dist.TCPStore(host, 0, size, True, timeout, wait_for_workers=False)
        if publish is not None:
            publish(store.port)
    else:
        store = dist.TCPStore(host, int(port), size, False, timeout)
    if backend_for(dev) == "nccl":  # pragma: no cover - no GPU on the CI machines
        pg = dist.ProcessGroupNCCL(store, rank, size)
    else:
        pg = dist.ProcessGroupGloo(store, rank, size, timeout)
    return Group(pg, rank, size, dev, store)
