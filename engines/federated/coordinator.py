"""The server's side of a run (what the ServerApp runs), over any transport.

A transport has ``nodes()`` (the ids of the connected nodes), ``exchange(sends,
timeout)`` (``sends``: node id -> (kind, job, arrays); returns node id -> (arrays, reply)
or an error string, for the replies that arrived in time), and the same in two halves,
``send(sends)`` (node id -> a handle) and ``receive(handles, timeout)``, so that a reply
that came after its timeout can still be read later (a hello). ``serverapp.GridTransport``
is Flower's Grid (real SuperNodes); ``LocalTransport`` calls ``siteapp.handle`` in this
process (unit tests and the bench's simulated sites).

Per round: new nodes are asked to prove which site they are (``hello``: MAC, the dataset
they serve, their table against the declared schema); sites are Poisson-sampled among
the *registered* ones (a sampled site that is not connected, or does not reply in time,
contributes nothing: the round goes on with the rest); each reply is checked (MAC, the
node bound to that site, the dataset, the update's shape, finiteness and norm: a bad one
is rejected and reported, never averaged); the accepted updates are summed and noised once
(``dpfedavg.noisy_mean``). Then the global model is evaluated on the held-out rows of every
bound site, and the sums released with the plan's Laplace noise and a 95% interval.
Before each round: a cancel stops the run (``Stopped``), as does a round that would pass
``max_epsilon``. The events of the rounds and evaluations done are always known.
"""

from __future__ import annotations

import math
import os
import secrets
import time
from typing import Callable

import numpy as np

from engines.aggregates.noise import Noise
from engines.dpsgd.intervals import ALPHA_EACH, ratio_estimate, ratio_interval

from . import auth, dpfedavg, model, planner, secagg, siteapp


class LocalTransport:
    """Sites in this process: node id -> node_config (as a SuperNode's)."""

    def __init__(self, node_configs: dict[int, dict]):
        self.node_configs = dict(node_configs)
        self.bytes = 0
        self._grid = None

    def nodes(self):
        return list(self.node_configs)

    def secure_sum(self, sends: dict, *, clip: float, rnd: int, timeout: float):
        from . import flwr_apps

        if self._grid is None:
            self._grid = secagg.LocalGrid(flwr_apps.client_app, self.node_configs)
        return secagg.secure_sum(self._grid, sends, clip=clip, rnd=rnd, timeout=timeout)

    def exchange(self, sends: dict, timeout: float) -> dict:
        out = {}
        for node, (kind, job, arrays) in sends.items():
            try:
                out[node] = siteapp.handle(kind, job, arrays, self.node_configs[node])
            except Exception as e:  # a site's crash is that site's problem (its message stays here, as Flower's)
                out[node] = f"site error: {type(e).__name__}"
        return out

    def send(self, sends: dict) -> dict:
        """The replies at once (here a reply comes at once or never): the handles."""
        return self.exchange(sends, 0.0)

    def receive(self, handles: dict, timeout: float) -> dict:
        return dict(handles)


class Coordinator:
    def __init__(self, details: dict, site_keys: dict[str, str], transport, *, emit: Callable[[dict], None],
                 cancelled: Callable[[], bool] = lambda: False, wait_sites_seconds: float = 30.0,
                 round_timeout: float = 120.0, min_sites: int | None = None):
        self.d = details
        self.spec = details["spec"]
        self.site_eval_rows = details.get("site_eval_rows") or {}  # plans from before it: no bound
        self.keys = {s: k for s, k in site_keys.items() if s in self.spec["sites"]}  # registered for this dataset
        self.t = transport
        self.emit, self.cancelled = emit, cancelled
        self.wait_sites_seconds, self.round_timeout = wait_sites_seconds, round_timeout
        self.min_sites = min_sites
        self.run_nonce = secrets.token_hex(16)
        self.node_site: dict[int, str] = {}
        self.refused: dict[int, str] = {}  # node -> why (unregistered, bad MAC, schema, other dataset)
        self.refused_sites: set[str] = set()  # registered sites that answered and were refused
        self.refused_on_rows: set[str] = set()  # of them, those whose own refusal followed a read of their table
        self.lost: dict[int, str] = {}  # node -> site: bound, then silent past a round's timeout
        self.unanswered: dict[int, tuple] = {}  # node -> (handle, job): a hello not answered in time
        self.rounds = 0
        self.evals = 0
        self.history: list[dict] = []
        self.weights = model.init(self.spec["features"], self.spec["classes"])
        self.shapes = [a.shape for a in self.weights]
        self.private = self.spec["private"]
        self.eval_at = set(planner.eval_rounds(self.spec["rounds"], self.spec["eval_every"]))
        self.local = details.get("local")  # local sample-level DP: per-site q, z, steps
        # central DP bounds each site's update by C; local DP's updates are private already (finite is enough)
        self.clip = self.spec["clip_norm"] if self.private and not self.local else math.inf
        # under secure aggregation the sites clip a little tighter: quantizing must not take them past C
        self.secure = bool(self.spec.get("secure_aggregation"))
        self.site_clip = self.spec["clip_norm"]
        if self.secure:
            self.site_clip = secagg.quantization_clip(self.spec["clip_norm"], sum(a.size for a in self.weights))
        self.noise = Noise.from_dict(details["eval_noise"]) if details.get("eval_noise") else None
        import torch

        self.rows_asked = False  # a train or evaluate message sent: a site read its rows
        self.gen = torch.Generator()
        self.gen.manual_seed(int.from_bytes(os.urandom(8), "little"))

    # ------------------------------------------------------------------ messages
    def _job(self, kind: str, rnd: int, site: str | None = None) -> dict:
        s = self.spec
        site_spec = {k: s[k] for k in ("features", "target", "task", "test_fraction", "local_epochs",
                                      "local_learning_rate", "local_batch_size")}
        site_spec["clip_norm"] = self.site_clip if self.private else None
        job = {"kind": kind, "round": rnd, "nonce": secrets.token_hex(16), "run_nonce": self.run_nonce,
               "dataset": self.d["dataset"], "spec": site_spec}
        if self.local and site is not None:
            ls = self.local[site]
            job["local_dp"] = {"q": ls["q"], "z": ls["z"], "steps": ls["steps_per_round"], "clip": s["clip_norm"],
                               "n_train": ls["n_train"]}
        return job

    def _check(self, node: int, kind: str, job: dict, got) -> tuple[str | None, str | None, list, dict]:
        """(site or None, why refused or None, arrays, reply)."""
        if isinstance(got, str):
            return self.node_site.get(node), f"error: {got[:200]}", [], {}
        arrays, reply = got
        if not isinstance(reply, dict) or not isinstance(reply.get("site"), str) or not isinstance(arrays, list):
            # a hostile or broken agent's reply: refused for its node, never the run's end
            return self.node_site.get(node), "malformed reply", [], {}
        site = reply.get("site")
        if site not in self.keys:  # its claimed name is not repeated: it may be another dataset's site
            return None, "unregistered site", [], reply
        fields = dict(nonce=job["nonce"], round=job["round"], site=site, dataset=reply.get("dataset", ""), kind=kind,
                      payload=auth.digest(arrays))
        if reply.get("nonce") != job["nonce"] or not auth.verify(self.keys[site], reply.get("mac"), **fields):
            return None, f"bad MAC for site {site!r}", [], reply
        bound = self.node_site.get(node)
        if bound is not None and bound != site:
            return None, f"node speaks for {bound!r}, claims {site!r}", [], reply
        if kind != "hello" and bound is None:
            return None, "not identified", [], reply
        if reply.get("dataset") != self.d["dataset"]:
            # not named: the other dataset may be one the analyst is not granted (a probe
            # read "h3: serves dataset 'clinics2'", a name her GET answers 404 for)
            return site, "serves another dataset", [], reply
        if reply.get("refused"):  # (a site's own words, cut: a modified agent's 2 MB reason went into the result)
            return site, str(reply["refused"])[:200], [], reply
        return site, None, arrays, reply

    def identify(self) -> None:
        """Asks new nodes who they are, and reads the late answers of nodes that were silent
        at their hello (without waiting: asked again every round, a silent node added the
        whole round timeout to each; a slow first start of a site's ClientApp is not a
        refusal)."""
        answers = {}
        if self.unanswered:
            got = self.t.receive({n: h for n, (h, _) in self.unanswered.items()}, 0.0)
            for n in got:
                answers[n] = (self.unanswered.pop(n)[1], got[n])
                self.refused.pop(n, None)
        new = [n for n in self.t.nodes() if n not in self.node_site and n not in self.refused and n not in self.lost
               and n not in answers]
        if new:
            jobs = {n: self._job("hello", self.rounds) for n in new}
            handles = self.t.send({n: ("hello", jobs[n], []) for n in new})
            got = self.t.receive(handles, self.round_timeout)
            for n in new:
                if n in got:
                    answers[n] = (jobs[n], got[n])
                    continue
                self.refused[n] = "no answer to hello"  # (unless it answers later)
                if n in handles:
                    self.unanswered[n] = (handles[n], jobs[n])
                self.emit({"event": "refused", "node": str(n), "site": None, "why": "no answer to hello"})
        for n, (job, reply) in answers.items():
            site, why, _, body = self._check(n, "hello", job, reply)
            if why is None and site in self.node_site.values():
                why = f"site {site!r} is already connected on another node"
            if why is None:
                self.node_site[n] = site
                if n not in new:
                    self.emit({"event": "identified", "node": str(n), "site": site, "late": True})
            else:
                self.refused[n] = why if site is None else f"{site}: {why}"
                if site is not None:
                    self.refused_sites.add(site)
                    if body.get("refused") and body.get("dataset") == self.d["dataset"]:
                        self.refused_on_rows.add(site)  # its own refusal, on its table (schema, unreadable)
                self.emit({"event": "refused", "node": str(n), "site": site, "why": why})

    def wait_for_sites(self) -> None:
        deadline = time.monotonic() + self.wait_sites_seconds
        while True:
            self.identify()
            answered = set(self.node_site.values()) | self.refused_sites
            enough = self.min_sites is not None and len(self.node_site) >= self.min_sites
            if answered >= set(self.keys) or enough or time.monotonic() >= deadline:
                return
            time.sleep(0.5)

    # ------------------------------------------------------------------ one round
    def epsilon(self, rounds: int | None = None, evals: int | None = None):
        return planner.epsilon_after(self.d, self.rounds if rounds is None else rounds,
                                     self.evals if evals is None else evals)

    def event(self) -> dict:
        return planner.rounds_event(self.d, self.rounds, self.evals)

    def train_round(self) -> dict:
        rnd = self.rounds + 1
        self.identify()
        q = self.spec["sample_rate"]
        sampled = dpfedavg.sample_sites(self.spec["sites"], q)
        site_node = {s: n for n, s in self.node_site.items()}
        sends, jobs = {}, {}
        for s in sampled:
            if s in site_node:
                n = site_node[s]
                jobs[n] = self._job("train", rnd, s)
                sends[n] = ("train", jobs[n], self.weights)
        self.rows_asked = self.rows_asked or bool(sends)
        aggregate = self._secure_sum if self.secure else self._plain_sum
        total, accepted, rejected, (sent_bytes, recv_bytes), secure = aggregate(sends, jobs, rnd)
        # the round is spent once the noisy sum is formed, whoever replied
        if total is None:  # secure aggregation gave no sum: the model stays as it was
            mean = None
        elif self.private and self.local:  # noise was added at the sites: the plain mean of the replies
            mean = [t / max(len(accepted), 1) for t in total]
        elif self.private:
            z, c = self.d["noise_multiplier"], self.spec["clip_norm"]
            expected = q * self.spec["n_sites"]
            mean = dpfedavg.noisy_mean(total, z * c, expected, self.gen)
            if self.secure and secagg.out_of_range([m * expected for m in mean], secure["in_sum"], c, z * c):
                secure["why"] = "the noisy sum is out of range for the sites in it (a malformed masked vector)"
                mean, accepted = None, []
        else:
            mean = [t / max(len(accepted), 1) for t in total]
        lr = self.spec["server_learning_rate"]
        if mean is not None:
            self.weights = [w + lr * m for w, m in zip(self.weights, mean)]
        self.rounds = rnd
        row = {"round": rnd, "sites": {"sampled": sorted(sampled), "accepted": sorted(accepted),
                                       "rejected": rejected,
                                       "not_connected": sorted(s for s in sampled if s not in site_node),
                                       "connected": sorted(self.node_site.values())},  # after this round's drops
               "bytes": {"sent": int(sent_bytes), "received": int(recv_bytes)}}
        if secure is not None:
            row["secure_aggregation"] = secure
        row["eval"] = self.evaluate(rnd) if rnd in self.eval_at else {}
        row["epsilon"] = self.epsilon()
        row["evals"] = self.evals  # (no round's duration: the sites' training time follows their rows)
        self.history.append(row)
        return row

    def _plain_sum(self, sends: dict, jobs: dict, rnd: int):
        """Every reply checked on its own (MAC, node, shape, finite, norm <= C), the good ones
        summed. Returns what ``_secure_sum`` does: (sum, accepted, rejected, (bytes sent,
        received), None)."""
        got = self.t.exchange(sends, self.round_timeout)
        total = [np.zeros_like(a) for a in self.weights]
        accepted, rejected, recv_bytes = [], {}, 0
        for n in sends:
            site = self.node_site[n]
            if n not in got:  # dropped (killed, cut off): its share counts 0; a restart is a new node
                rejected[site] = "no reply in time"
                self.lost[n] = self.node_site.pop(n)
                continue
            _, why, arrays, _ = self._check(n, "train", jobs[n], got[n])
            if why is None:
                arrays, why = _real_arrays(arrays)
            if why is None:
                recv_bytes += sum(a.nbytes for a in arrays)
                why = dpfedavg.check_update(arrays, self.shapes, self.clip)
            if why is not None:
                rejected[site] = why
                continue
            accepted.append(site)
            for t, a in zip(total, arrays):
                t += a
        return total, accepted, rejected, (sum(a.nbytes for a in self.weights) * len(sends), recv_bytes), None

    def _secure_sum(self, sends: dict, jobs: dict, rnd: int):
        """SecAgg+ (``secagg``): the server gets the sum only. The sites checked their own
        updates; the server checks each reply's MAC and node, and takes the whole sum or
        nothing (one bad reply cannot be taken out of a sum)."""
        out = self.t.secure_sum({n: (jobs[n], self.weights) for n in sends}, clip=self.spec["clip_norm"], rnd=rnd,
                                timeout=self.round_timeout)
        accepted, rejected, silent, why = [], {}, [], out.why
        for n in sends:
            site = self.node_site[n]
            if n not in out.replies:
                # the protocol went on without it, or halted for want of its key shares while
                # others sent theirs (a site killed between rounds: kept, it halted every later
                # round it was sampled in, each charged): dropped, as a silent plain site
                if why is None or out.replies:
                    rejected[site] = "no masked update in the sum"
                    silent.append(site)
                    self.lost[n] = self.node_site.pop(n)
                else:
                    rejected[site] = "no sum this round"
                continue
            _, bad, _, reply = self._check(n, "train", jobs[n], ([], out.replies[n]))
            if bad is not None:
                rejected[site] = bad
                why = why or f"a reply in the sum failed its check ({site}: {bad})"
            elif reply.get("withheld"):
                rejected[site] = f"withheld at the site: {reply['withheld']}"
            else:
                accepted.append(site)
        if why is not None and silent:
            why += f" (no masked update from {', '.join(sorted(silent))})"
        total = out.total if why is None else None
        if total is None:
            accepted = []
        return total, accepted, rejected, (out.sent, out.received), {"why": why, "in_sum": len(out.replies)}

    def evaluate(self, rnd: int) -> dict:
        nodes = list(self.node_site)
        self.rows_asked = self.rows_asked or bool(nodes)
        jobs = {n: self._job("evaluate", rnd) for n in nodes}
        got = self.t.exchange({n: ("evaluate", jobs[n], self.weights) for n in nodes}, self.round_timeout)
        correct = count = 0.0
        sites = []
        for n in nodes:
            if n not in got:
                self.lost[n] = self.node_site.pop(n)
                continue
            site, why, _, reply = self._check(n, "evaluate", jobs[n], got[n])
            ev = reply.get("eval") if why is None else None
            if not isinstance(ev, dict) or not ev:
                continue
            try:
                c, k = float(ev.get("correct", 0)), float(ev.get("count", 0))
            except (TypeError, ValueError):  # a list, an object: not counts
                continue
            if not (math.isfinite(c) and math.isfinite(k) and 0 <= c <= k):
                continue
            if site in self.site_eval_rows:  # at most the held-out rows its registered rows allow
                k = min(k, float(self.site_eval_rows[site]))
                c = min(c, k)
            correct, count = correct + c, count + k
            sites.append(site)
        if not self.private:
            acc = correct / count if count else None
            return {"accuracy": acc, "n": count, "sites": sorted(sites), "dp": False}
        if self.noise is None:
            return {}
        released = self.noise.release([correct, count])  # OpenDP Laplace: the plan's budget per round
        self.evals += 1
        s, k = released
        t = self.noise.halfwidth(ALPHA_EACH)
        acc, ci = ratio_estimate(s, k, t), ratio_interval(s, k, t)  # None: a count within its noise of none
        return {"accuracy": acc, "accuracy_ci95": ci, "n_released": k, "sites": sorted(sites), "dp": True}

    # ------------------------------------------------------------------ the run
    def run(self) -> str:
        """Train; returns why it stopped: completed, max_epsilon, cancelled, or no_sites (no
        registered site took part: none answered within the wait, or each that did was
        refused at hello; none was sent work, none read a row)."""
        self.wait_for_sites()
        self.emit({"event": "sites", "connected": sorted(self.node_site.values()),
                   "refused": {str(n): w for n, w in self.refused.items()}})
        # every site refused, none on its rows (another dataset, a bad key): the rounds trained
        # noise alone, charged in full (a probe); a site that refused on its table read it
        if not self.node_site and not self.refused_on_rows:
            return "no_sites"
        cap = self.spec["max_epsilon"]
        with_eval = self.noise is not None
        for _ in range(self.spec["rounds"]):
            if self.cancelled():
                return "cancelled"
            nxt = self.rounds + 1
            if cap is not None and self.epsilon(nxt, self.evals + int(with_eval and nxt in self.eval_at)) > cap:
                return "max_epsilon"
            row = self.train_round()
            self.emit({"event": "round", **row})
        return "completed"

    def result(self, reason: str) -> dict:
        return {"stopped": reason, "rows_asked": self.rows_asked, "rounds": self.rounds, "evals": self.evals,
                "epsilon": self.epsilon(),
                "event": self.event(), "history": self.history,
                "sites": {"connected": sorted(self.node_site.values()),
                          "refused": {str(n): w for n, w in self.refused.items()}},
                "weights": [a.tolist() for a in self.weights]}


def _real_arrays(arrays: list) -> tuple[list, str | None]:
    """A site's update as float64 arrays, or why not: only real numbers (a string array
    ended the run, a complex one lost its imaginary part silently)."""
    try:
        raw = [np.asarray(a) for a in arrays]
        if any(a.dtype.kind not in "fiub" for a in raw):
            return [], "not an array of real numbers"
        return [a.astype(np.float64) for a in raw], None
    except (TypeError, ValueError):
        return [], "not an array of real numbers"
