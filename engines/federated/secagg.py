"""Secure aggregation of the sites' updates with Flower's SecAgg+ (flwr 1.42), so that the
server sees only their sum.

One call, ``secure_sum``, runs Flower's own ``SecAggPlusWorkflow`` (its four message
stages: setup, share keys, collect masked vectors, unmask) on any Grid: Flower's real one
in the ServerApp (``flwr_apps.GridTransport``) or ``LocalGrid``, which hands each message
to the ClientApp in this process (``coordinator.LocalTransport``: tests and the bench's
simulated sites). The workflow lives in Flower's legacy ``Strategy`` world; ``_Collect`` is
the smallest Strategy that feeds it the per-site jobs and catches what it hands back.

What the sites send and why the sum keeps the DP guarantee:

- each site trains, clips its update to ``quantization_clip(C, d)`` (slightly below C) and
  checks it itself (``siteapp.handle_masked``): a NaN, an infinity or a norm
  over the bound is *withheld* -- the site masks zeros and says why -- because the server
  can no longer look at single updates;
- Flower's ``secaggplus_mod`` quantizes every coordinate to an integer in [0, 2^22]
  over [-C, C] by stochastic rounding, which moves each coordinate by less than one step
  2C / 2^22: the clip above leaves room for that, so every quantized update has L2 norm
  at most C and one site still changes the sum by at most C;
- the weight of every site is 1 (``max_weight`` 1, ``num_examples`` 1): the workflow
  returns the plain mean of the k updates it unmasked, and ``k x mean`` is their sum, to
  which the coordinator adds the Gaussian noise z C once, as without secure aggregation.

The threat model is Flower's: sites run the service's site agent (honest but curious),
the server is trusted to add the noise. A site running a modified agent can send any
masked vector; the server cannot tell which, so it cannot reject it alone. What it checks:
every reply's MAC and node (as for plain rounds), that the unmasked sum is finite, and --
after the noise, so that the check is post-processing -- that no coordinate of the noisy
sum is further from 0 than k C plus 8 noise deviations (``out_of_range``: never true of k
clipped updates but for a 1e-15 chance per coordinate): if not, the whole round's sum is
discarded (the round is still charged). Plain rounds (``secure_aggregation``
false) keep the per-update checks; that is the choice the request makes.
"""

from __future__ import annotations

import copy
import json
import math
from dataclasses import dataclass, field

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord, Context, Message, RecordDict
from flwr.common import Code, FitIns, FitRes, Status, ndarrays_to_parameters, parameters_to_ndarrays
from flwr.server.client_manager import SimpleClientManager
from flwr.server.compat.grid_client_proxy import GridClientProxy
from flwr.server.compat.legacy_context import LegacyContext
from flwr.server.strategy import Strategy
from flwr.server.workflow import SecAggPlusWorkflow
from flwr.server.workflow.constant import MAIN_CONFIGS_RECORD, MAIN_PARAMS_RECORD

QUANTIZATION_RANGE = 1 << 22  # Flower's default: each coordinate an integer in [0, 2^22]
MODULUS_RANGE = 1 << 32  # the masks' field; sums of up to 1023 sites cannot wrap
RECONSTRUCTION_THRESHOLD = 0.55  # of the shares (up to 7 sites): more than half, as SecAgg+ asks
MIN_SITES = 2  # the sum of one site is that site's update
JOB_KEY = "job"
REPLY_KEY = "reply"


def quantization_clip(c: float, d: int) -> float:
    """The L2 bound a site clips to so that its update, once quantized by stochastic
    rounding (each of its ``d`` coordinates moved by less than 2C / 2^22), is still <= C."""
    return c * (1.0 - 2.0 * math.sqrt(d) / QUANTIZATION_RANGE)


def sharing(n: int) -> tuple[int | float, int | float]:
    """(num_shares, reconstruction_threshold) for ``n`` sites. SecAgg+ (Bell et al. 2020)
    masks each site with its neighbours on a ring, not with every site: up to 7 sites all
    are neighbours; beyond, 2 ceil(log2 n) + 1 of them (15 at 100 sites), which keeps a
    round's work and bytes near n log n instead of n^2 (measured: bench_federated.py). A
    key is rebuilt from more than half of its shares."""
    if n <= 7:
        return 1.0, RECONSTRUCTION_THRESHOLD  # Flower's fractions: all sites, round(0.55 n) (at least 2)
    k = 2 * math.ceil(math.log2(n)) + 1
    return k, k // 2 + 1


class _Collect(Strategy):
    """Hands Flower's workflow one FitIns per node and keeps what it aggregates."""

    def __init__(self, grid, fitins: dict[int, FitIns]):
        self.grid, self.fitins = grid, fitins
        self.mean: list[np.ndarray] | None = None
        self.replies: dict[int, dict] = {}

    def configure_fit(self, server_round, parameters, client_manager):
        return [(GridClientProxy(n, self.grid, 0), ins) for n, ins in self.fitins.items()]

    def aggregate_fit(self, server_round, results, failures):
        if results:
            self.mean = parameters_to_ndarrays(results[0][1].parameters)
        for proxy, res in results:
            try:
                self.replies[proxy.node_id] = json.loads(str(res.metrics.get(REPLY_KEY, "{}")))
            except ValueError:
                self.replies[proxy.node_id] = {}
        return None, {}

    def initialize_parameters(self, client_manager):
        return None

    def configure_evaluate(self, server_round, parameters, client_manager):
        return []

    def aggregate_evaluate(self, server_round, results, failures):
        return None, {}

    def evaluate(self, server_round, parameters):
        return None


@dataclass
class SecureSum:
    total: list[np.ndarray] | None  # the sum of the unmasked updates; None: no sum (``why``)
    replies: dict[int, dict] = field(default_factory=dict)  # node -> its reply, for the nodes in the sum
    why: str | None = None
    sent: int = 0  # payload bytes of the protocol's four stages to the sites (the model included)
    received: int = 0  # and from them (keys, shares, masked vectors)


class _Counted:
    def __init__(self, grid):
        self.grid, self.sent, self.received = grid, 0, 0

    def send_and_receive(self, messages, *, timeout=None):
        messages = list(messages)
        self.sent += sum(content_bytes(m.content) for m in messages)
        replies = list(self.grid.send_and_receive(messages, timeout=timeout))
        self.received += sum(content_bytes(r.content) for r in replies if not r.has_error())
        return replies


class _SecAggPlus(SecAggPlusWorkflow):
    """Flower's SecAgg+, but a node that does not answer the setup stage is no longer one of
    the round's sampled nodes. It received no neighbour's keys and sent none, so no masked
    vector holds a mask shared with it and the unmask stage needs none of its key shares;
    Flower asked for them all the same and halted the round for want of them (a site killed
    between rounds halted every later round it was sampled in). A node that answered setup
    and drops later is still unmasked from its shares, as Flower does."""

    def setup_stage(self, grid, context, state) -> bool:
        ok = super().setup_stage(grid, context, state)
        state.sampled_node_ids = set(state.active_node_ids)
        return ok


def secure_sum(grid, sends: dict[int, tuple[dict, list[np.ndarray]]], *, clip: float, rnd: int,
               timeout: float | None) -> SecureSum:
    """Run SecAgg+ over ``sends`` (node -> (job, global weights)) on ``grid``."""
    if len(sends) < MIN_SITES:
        return SecureSum(None, why=f"secure aggregation needs at least {MIN_SITES} sites, {len(sends)} sampled and connected")
    grid = _Counted(grid)
    fitins = {n: FitIns(ndarrays_to_parameters(arrays), {JOB_KEY: json.dumps(job)}) for n, (job, arrays) in sends.items()}
    strategy = _Collect(grid, fitins)
    context = LegacyContext(Context(run_id=0, node_id=0, node_config={}, state=RecordDict(), run_config={}),
                            strategy=strategy, client_manager=SimpleClientManager())
    context.state.config_records[MAIN_CONFIGS_RECORD] = ConfigRecord({"current_round": rnd})
    context.state.array_records[MAIN_PARAMS_RECORD] = ArrayRecord([np.asarray(a) for a in next(iter(sends.values()))[1]])
    shares, threshold = sharing(len(sends))
    _SecAggPlus(num_shares=shares, reconstruction_threshold=threshold, max_weight=1.0,
                clipping_range=float(clip), quantization_range=QUANTIZATION_RANGE,
                modulus_range=MODULUS_RANGE, timeout=timeout)(grid, context)
    out = SecureSum(None, strategy.replies, sent=grid.sent, received=grid.received)
    if strategy.mean is None:
        out.why = "secure aggregation halted: too few sites answered a stage to unmask the sum"
        return out
    k = len(strategy.replies)
    total = [np.asarray(m, dtype=np.float64) * k for m in strategy.mean]
    if not all(np.all(np.isfinite(m)) for m in total):
        out.why = "the unmasked sum is not finite (a site sent a malformed masked vector)"
        return out
    out.total = total
    return out


def out_of_range(noisy_total: list[np.ndarray], k: int, clip: float, std: float) -> bool:
    """Whether a coordinate of the noisy sum of ``k`` updates clipped to ``clip`` (noise
    ``std``) is beyond what they can reach plus 8 noise deviations: a malformed masked
    vector in the sum (post-processing: it reads the noisy sum only)."""
    bound = k * clip + 8.0 * std
    return any(not np.all(np.abs(a) <= bound) for a in noisy_total)


# ---------------------------------------------------------------------------- the site's side
def is_masked_fit(content: RecordDict) -> bool:
    return "fitins.config" in content.config_records


def site_fit(content: RecordDict, run) -> RecordDict:
    """The ClientApp's answer to SecAgg+'s collect stage: ``run(job, arrays)`` ->
    (update, reply); the update goes back as a FitRes of weight 1, for
    ``secaggplus_mod`` to quantize and mask."""
    from flwr.compat.common.recorddict_compat import fitres_to_recorddict, recorddict_to_fitins

    ins = recorddict_to_fitins(content, keep_input=True)
    update, reply = run(json.loads(str(ins.config[JOB_KEY])), parameters_to_ndarrays(ins.parameters))
    res = FitRes(Status(Code.OK, ""), ndarrays_to_parameters([np.asarray(a) for a in update]), 1,
                 {REPLY_KEY: json.dumps(reply)})
    return fitres_to_recorddict(res, keep_input=True)


def site_mod(msg, context, call_next):
    """``secaggplus_mod`` for the messages of a SecAgg+ run only (plain train messages
    carry no SecAgg+ configs and pass straight through)."""
    from flwr.client.mod import secaggplus_mod
    from flwr.common.secure_aggregation.secaggplus_constants import RECORD_KEY_CONFIGS

    if RECORD_KEY_CONFIGS in msg.content.config_records:
        return secaggplus_mod(msg, context, call_next)
    return call_next(msg, context)


class LocalGrid:
    """A Grid whose nodes are ClientApp calls in this process (one Context per node, kept
    across the protocol's stages as a SuperNode keeps it)."""

    def __init__(self, client_app, node_configs: dict[int, dict]):
        from flwr.supercore.task_identity import TaskIdentity

        self.app, self.node_configs = client_app, node_configs
        self.contexts: dict[int, Context] = {}
        if TaskIdentity._run_id is None:  # what Flower's runtime sets in a ServerApp process (messages need it)
            TaskIdentity.task_id, TaskIdentity.run_id, TaskIdentity.node_id = 0, 0, 0

    def send_and_receive(self, messages, *, timeout=None):
        out = []
        for msg in messages:
            n = msg.metadata.dst_node_id
            ctx = self.contexts.setdefault(n, Context(run_id=0, node_id=n, node_config=dict(self.node_configs[n]),
                                                      state=RecordDict(), run_config={}))
            try:  # a copy, as the wire gives each node its own (the workflow shares one content between nodes)
                out.append(self.app(copy.deepcopy(msg), ctx))
            except Exception as e:  # a site's crash is that site's problem, as on a SuperNode
                from flwr.app import Error

                out.append(Message(error=Error(code=0, reason=f"{type(e).__name__}: {e}"), reply_to=msg))
        return out


def content_bytes(rd: RecordDict) -> int:
    """The payload bytes of a message: arrays, and the bytes and strings of its configs."""
    total = 0
    for rec in rd.array_records.values():
        total += sum(len(a.data) for a in rec.values())
    for rec in rd.config_records.values():
        for v in rec.values():
            for x in (v if isinstance(v, list) else [v]):
                total += len(x) if isinstance(x, (bytes, str)) else 8
    return total
