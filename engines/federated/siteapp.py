"""The site's side of a round (what the ClientApp runs in the SuperNode's process).

``handle(kind, job, arrays, node_config)`` -> ``(arrays, reply)``. ``node_config`` is the
SuperNode's own configuration, set by the site agent (``engines.federated.site``):
``site`` (its id), ``dataset`` (the one dataset it serves), ``table`` (the local CSV or
Parquet file), ``key-file`` (its secret). Kinds:

- ``hello``: prove the site's identity and check the local table against the declared
  schema sent in the job; refuses a dataset other than its own.
- ``train``: local SGD from the global weights on the site's training split; the update
  (new minus global weights) is clipped to ``clip_norm`` here, before it leaves the site
  (the server checks it again); also the exact held-out sums of the global model. In
  local mode (``local_dp`` in the job) the site runs DP-SGD instead (``model.dp_sgd``).
- ``evaluate``: the exact held-out sums (correct predictions, rows) of the global model;
  the server adds the noise (central DP: the service is the trusted aggregator).

``misbehave`` (tests only: the fault-injection switch of the site agent) makes a site send
a NaN update (``nan``), an unclipped, oversized one (``oversized``) or an evaluation that
claims 10**15 held-out rows (``inflate_eval``), so the server's checks can be tested on
real processes.
"""

from __future__ import annotations

import logging

import numpy as np

from . import auth, dpfedavg, model, site_data

log = logging.getLogger(__name__)


def _secret(node_config: dict) -> str:
    path = node_config.get("key-file")
    if not path:
        return ""
    with open(str(path)) as f:
        return f.read().strip()


def handle(kind: str, job: dict, arrays: list[np.ndarray], node_config: dict) -> tuple[list[np.ndarray], dict]:
    site = str(node_config.get("site", ""))
    served = str(node_config.get("dataset", ""))
    secret = _secret(node_config)
    reply = {"site": site, "dataset": served, "kind": kind, "round": job["round"], "nonce": job["nonce"]}

    def sign(payload_arrays):
        reply["mac"] = auth.mac(secret, nonce=job["nonce"], round=job["round"], site=site, dataset=served, kind=kind,
                                payload=auth.digest(payload_arrays))
        return payload_arrays, reply

    if served != job["dataset"]:
        reply["refused"] = f"site {site!r} serves dataset {served!r}, not {job['dataset']!r}"
        return sign([])
    try:
        return sign(_work(kind, job, arrays, node_config, secret, reply))
    except site_data.SchemaMismatch as e:  # the details stay here, in the site's log
        log.warning("site %s refuses job on dataset %s: %s", site, served, e.detail)
        reply["refused"] = f"schema: {e}"
    except Exception as e:  # noqa: BLE001 - its message can quote a row: it stays in the site's log
        # (a CSV parser's error names the line it stopped at: "Expected 4 columns, got 5: 0.5,...")
        log.warning("site %s could not run a %s job on dataset %s", site, kind, served, exc_info=True)
        reply["refused"] = ("table: the site's table could not be read (see the site's log)" if isinstance(e, OSError)
                            else "the site could not run the job (see the site's log)")
    reply.pop("eval", None)
    return sign([])


def _work(kind: str, job: dict, arrays: list[np.ndarray], node_config: dict, secret: str,
          reply: dict) -> list[np.ndarray]:
    """The job's work on the site's rows: the update (train), nothing (hello, evaluate);
    ``reply`` gets the held-out sums."""
    spec = job["spec"]
    table = site_data.read_table(str(node_config["table"]))
    x_tr, y_tr, x_te, y_te = site_data.prepare(table, spec, auth.split_seed(secret, job["run_nonce"]))
    if kind == "hello":
        return []
    w = [np.asarray(a, dtype=np.float64) for a in arrays]
    reply["eval"] = {"correct": float(np.sum(model.predict(w, x_te) == y_te)) if len(x_te) else 0.0,
                     "count": float(len(x_te))}
    if str(node_config.get("misbehave", "")) == "inflate_eval":
        reply["eval"]["count"] = 1e15
    if kind == "evaluate":
        return []
    local = job.get("local_dp")
    if local:  # sample-level DP at the site: the update leaves the site already private
        new = model.dp_sgd(w, x_tr, y_tr, steps=local["steps"], q=local["q"], z=local["z"], clip=local["clip"],
                           expected=local["q"] * local["n_train"], lr=spec["local_learning_rate"])
    else:
        new = model.local_train(w, x_tr, y_tr, epochs=spec["local_epochs"], lr=spec["local_learning_rate"],
                                batch=spec["local_batch_size"], rng=np.random.default_rng())
    update = [a - b for a, b in zip(new, w)]
    misbehave = str(node_config.get("misbehave", ""))
    if misbehave == "oversized":
        norm = dpfedavg.global_norm(update) or 1.0
        update = [a * (10 * spec["clip_norm"] / norm) for a in update]
    elif misbehave == "nan":
        update[0] = update[0].copy()
        update[0].flat[0] = np.nan
    elif spec["clip_norm"] is not None and not local:
        update, _ = dpfedavg.clip(update, spec["clip_norm"])
    return update


def handle_masked(job: dict, arrays: list[np.ndarray], node_config: dict) -> tuple[list[np.ndarray], dict]:
    """``train`` for a round under secure aggregation (``secagg``): the server will see
    only the sum, so the site checks its own update (shape, finite, norm <= the job's
    ``clip_norm``); a bad one, or a refusal, is *withheld*: zeros go into the sum and the
    reply says why. The reply carries no held-out sums and its MAC covers no arrays."""
    update, reply = handle("train", job, arrays, node_config)
    reply.pop("eval", None)
    w = [np.asarray(a, dtype=np.float64) for a in arrays]
    why = reply.get("refused")
    if not why:
        bad = dpfedavg.check_update(update, [a.shape for a in w], job["spec"]["clip_norm"])
        # the category only: the server is not to learn anything of the update (not its norm)
        why = bad if bad in (None, "shape", "not_finite") else "norm over the clip"
    if why:
        update = [np.zeros_like(a) for a in w]
        reply["withheld"] = str(why)
    reply["mac"] = auth.mac(_secret(node_config), nonce=job["nonce"], round=job["round"], site=reply["site"],
                            dataset=reply["dataset"], kind="train", payload=auth.digest([]))
    return update, reply
