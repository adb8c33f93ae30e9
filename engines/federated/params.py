"""Validation of a federated training request against the dataset's public metadata
(the declared schema and the registered sites). No torch, no flwr, no data.

Parameters (kind ``train``): ``target``, ``task`` (binary | multiclass), ``target_threshold``,
``positive_values``, ``features`` (as the dpsgd engine: declared numeric columns with bounds
and categorical columns with a domain); ``mode`` ("central": client-level DP-FedAvg; "local":
sample-level DP-SGD at each site, ``clip_norm`` then clipping each row's gradient and
``local_batch_size`` the expected Poisson batch; see ``planner``); ``rounds``;
``sites_per_round`` (expected sites per round, from 1: q = sites_per_round / registered
sites, default all); ``target_epsilon`` (a number, or "inf"
for non-private FedAvg) or ``noise_multiplier``; ``max_epsilon`` (stop before a round that
would pass it); ``clip_norm`` C (of a site's whole update); ``local_epochs``,
``local_learning_rate``, ``local_batch_size``, ``server_learning_rate``; ``eval_epsilon``
(the held-out evaluations' share, spread over the rounds; default 5% of target_epsilon);
``eval_every`` (evaluate after every k-th round and the last; each evaluation is one more
message to every site); ``test_fraction``; ``delta``; ``secure_aggregation`` (Flower's SecAgg+, central mode: the server sees only the sum of the
sampled sites' updates; see ``secagg``).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from engines.dpsgd.params import _Errors, _target_spec, features_of
from engines.types import DatasetMeta, PlanError
from engines.validation import run_delta_error, unknown_keys, unknown_message

KINDS = ("train",)
MODES = ("central", "local")
MAX_ROUNDS = 1000
DEFAULT_EVAL_SHARE = 0.05
KEYS = {"target", "task", "target_threshold", "positive_values", "features", "mode", "rounds", "sites_per_round",
        "target_epsilon", "noise_multiplier", "max_epsilon", "clip_norm", "local_epochs", "local_learning_rate",
        "local_batch_size", "server_learning_rate", "eval_epsilon", "eval_every", "test_fraction", "delta", "secure_aggregation"}


@dataclass
class Spec:
    kind: str
    mode: str
    task: str
    target: dict
    features: list
    classes: int
    rounds: int
    n_sites: int
    sites_per_round: float
    sample_rate: float
    private: bool
    target_epsilon: float | None
    noise_multiplier: float | None
    max_epsilon: float | None
    clip_norm: float
    local_epochs: int
    local_learning_rate: float
    local_batch_size: int
    server_learning_rate: float
    eval_epsilon: float
    eval_every: int
    test_fraction: float
    delta: float
    sites: list  # registered site ids, in the registry's order
    secure_aggregation: bool = False  # Flower's SecAgg+: the server sees only the sum (``secagg``)

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "Spec":
        return cls(**d)


def registered_sites(ds: DatasetMeta) -> list[dict]:
    return [dict(s) for s in (getattr(ds, "sites", None) or ())]


def validate(kind: str, params: dict, ds: DatasetMeta) -> Spec:
    if not isinstance(params, dict):
        raise PlanError("params must be an object", {"params": "must be an object"})
    errors = _Errors()
    unknown, n_unknown = unknown_keys(params, KEYS)
    if unknown:
        errors["params"] = f"unknown parameter(s): {unknown_message(unknown, n_unknown)}"
    sites = registered_sites(ds)
    ids = [s.get("site") for s in sites]
    if not sites:
        errors["dataset"] = "not a federated dataset: it has no registered sites"
    elif not all(isinstance(i, str) and i for i in ids) or len(set(ids)) != len(ids):
        errors["dataset"] = "the registered sites need distinct non-empty ids"
    if ds.unit_column:
        errors["dataset"] = ("a privacy-unit column is not supported yet by the federated engine (the held-out "
                             "evaluation bounds rows, not units)")
    mode = params.get("mode", "central")
    if mode not in MODES:
        errors["mode"] = f"must be one of {', '.join(MODES)}, got {mode!r}"
    elif mode == "local" and any(not isinstance(s.get("n_rows"), int) or s["n_rows"] < 10 for s in sites):
        errors["dataset"] = "local DP needs every registered site's row count (at least 10): it fixes the sampling"
    secure = params.get("secure_aggregation", False)
    if not isinstance(secure, bool):
        errors["secure_aggregation"] = f"must be true or false, got {secure!r}"
    elif secure and (mode != "central" or params.get("target_epsilon") == "inf"):
        errors["secure_aggregation"] = ("SecAgg+ sums updates clipped to C: only in mode \"central\" with a "
                                        "private target (the local mode's updates are private already)")
    elif secure and len(sites) < 2:
        errors["secure_aggregation"] = "needs at least 2 registered sites (the sum of one site is its update)"

    task, target = _target_spec(params, ds, errors)
    if task == "regression":
        errors["task"] = "the federated engine trains classifiers (binary or multiclass)"
    features = features_of(params, ds, errors)

    rounds = errors.number(params, "rounds", 10, lo=1, hi=MAX_ROUNDS, integer=True)
    n_sites = len(sites)
    # at least one site expected a round: the noise is divided by q N, and 1e-315 of a site
    # made the model's weights inf after the read, charged and nothing released (a probe)
    per_round = errors.number(params, "sites_per_round", n_sites or 1, lo=1, hi=max(n_sites, 1))
    q = min(1.0, (per_round or 1) / max(n_sites, 1))
    te, nm = params.get("target_epsilon"), params.get("noise_multiplier")
    private = te != "inf"
    if te == "inf":
        if nm is not None:
            errors["noise_multiplier"] = "not with target_epsilon \"inf\" (non-private FedAvg)"
        te = None
    else:
        if (te is None) == (nm is None):
            errors["target_epsilon"] = "give exactly one of target_epsilon and noise_multiplier"
        te = errors.number(params, "target_epsilon", None, lo=0, hi=100, lo_open=True)
        nm = errors.number(params, "noise_multiplier", None, lo=0, hi=1000, lo_open=True)
    cap = errors.number(params, "max_epsilon", None, lo=0, hi=1000, lo_open=True)
    if cap is not None and not private:
        errors["max_epsilon"] = "only for a private run"
    clip_norm = errors.number(params, "clip_norm", 1.0, lo=0, hi=1e6, lo_open=True)
    local_epochs = errors.number(params, "local_epochs", 1, lo=1, hi=100, integer=True)
    lr = errors.number(params, "local_learning_rate", 0.5, lo=0, hi=100, lo_open=True)
    batch = errors.number(params, "local_batch_size", 32, lo=1, hi=100_000, integer=True)
    server_lr = errors.number(params, "server_learning_rate", 1.0, lo=0, hi=100, lo_open=True)
    default_eval = DEFAULT_EVAL_SHARE * te if te else (0.1 if private else 0.0)
    ev = errors.number(params, "eval_epsilon", default_eval, lo=0, hi=100)
    if te and ev is not None and ev >= te / 2:
        errors["eval_epsilon"] = f"must be less than half of target_epsilon ({te:g}), got {ev:g}"
    if not private and ev:
        errors["eval_epsilon"] = "a non-private run evaluates exactly"
    eval_every = errors.number(params, "eval_every", 1, lo=1, hi=MAX_ROUNDS, integer=True)
    test_fraction = errors.number(params, "test_fraction", 0.2, lo=0.0, hi=0.5, lo_open=True)
    delta = errors.number(params, "delta", ds.delta, lo=0, hi=0.1, lo_open=True)
    if delta and "delta" not in errors and (problem := run_delta_error(delta, ds.delta)):
        errors["delta"] = problem

    if errors:
        first = next(iter(errors.items()))
        raise PlanError(f"invalid {kind} request: {first[0]}: {first[1]}", dict(errors))
    classes = len(target["classes"]) if task == "multiclass" else 2
    return Spec(kind=kind, mode=mode, task=task, target=target, features=features, classes=classes,
                rounds=rounds, n_sites=n_sites, sites_per_round=float(per_round), sample_rate=q, private=private,
                target_epsilon=te, noise_multiplier=nm, max_epsilon=cap, clip_norm=clip_norm,
                local_epochs=local_epochs, local_learning_rate=lr, local_batch_size=batch,
                server_learning_rate=server_lr, eval_epsilon=ev or 0.0, eval_every=eval_every, test_fraction=test_fraction, delta=delta,
                sites=ids, secure_aggregation=bool(secure))
