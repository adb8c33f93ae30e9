"""The demo's federated part (issue 27): the GSS rows cut by survey year into 5 sites (non-IID:
each site is an era), registered as a federated dataset (schema and sites, no rows), 5 site
agents as real processes (``python -m engines.federated.site`` -> ``flower-supernode``) on a
real Flower SuperLink, each with the secret the officer handed it; the analyst trains across
them at the DP-SGD run's target epsilon and the demo prints both accuracies.

Called by ``manage.py demo``: ``start`` before the demo's worker starts (the worker reads
``FEDERATED_SUPERLINK`` from its environment; the sites connect meanwhile), ``train`` after
the DP-SGD run, ``stop`` at the end.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from django.conf import settings
from django.core.management.base import CommandError

SITES = 5
# One round (2 local epochs at each site) and one DP evaluation: flwr 1.42 polls every 3 s and
# starts a process per message, so each exchange with the sites costs ~5-10 s on a quiet
# machine, and a run is the sites' hello, the round and the evaluation.
PARAMS = {"mode": "local", "rounds": 1, "eval_every": 1, "local_epochs": 2, "local_batch_size": 64,
          "local_learning_rate": 0.5, "clip_norm": 1.0}


class FederatedDemo:
    def __init__(self, out):
        self.out = out
        self.work = Path(settings.VAR_DIR) / "demo-federated"
        self.procs: list[subprocess.Popen] = []
        self.superlink = None

    def start(self, off, gss_path: Path, gss: dict, call) -> None:
        """Register the federated dataset, start the SuperLink and the 5 site agents."""
        import pandas as pd

        from engines.federated import processes

        self.work.mkdir(parents=True, exist_ok=True)
        os.chmod(self.work, 0o700)
        rows = pd.read_parquet(gss_path).sort_values("year", kind="stable").reset_index(drop=True)
        cuts = [len(rows) * i // SITES for i in range(SITES + 1)]
        sites = []
        for i in range(SITES):
            part = rows.iloc[cuts[i]:cuts[i + 1]]
            name = f"wave-{i + 1}"
            part.to_parquet(self.work / f"{name}.parquet", index=False)
            sites.append({"site": name, "n_rows": len(part), "years": (int(part.year.min()), int(part.year.max()))})
        columns = [{k: v for k, v in c.items() if k not in ("domain_from_data", "integer_from_data")}
                   for c in gss["columns"]]
        r = call(off, "post", "/api/datasets/", {
            "name": "gss-sites", "title": "GSS wages, held by 5 sites (one per era)", "execution": "federated",
            "schema": columns, "sites": [{"site": s["site"], "n_rows": s["n_rows"]} for s in sites],
            "budget_epsilon": 5.0, "budget_delta": "auto", "activate": True})
        self.out(f"registered gss-sites (federated): {r.json()['n_rows']:,} rows over {SITES} sites, none stored here:")
        for s in sites:
            self.out(f"   {s['site']}: {s['n_rows']:>6,} rows, survey years {s['years'][0]}-{s['years'][1]}")
        self.superlink, address = processes.start_superlink(self.work)
        os.environ["FEDERATED_SUPERLINK"] = address  # the worker started next reads it
        settings.FEDERATED_SUPERLINK = address
        for s in sites:
            secret = call(off, "post", f"/api/datasets/gss-sites/sites/{s['site']}/secret/").json()["secret"]
            key = self.work / f"{s['site']}.secret"
            fd = os.open(key, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            with os.fdopen(fd, "w") as f:
                f.write(secret)
            log = open(self.work / f"{s['site']}.log", "wb")
            self.procs.append(subprocess.Popen(
                [sys.executable, "-m", "engines.federated.site", "--superlink", address, "--insecure",
                 "--table", str(self.work / f"{s['site']}.parquet"), "--dataset", "gss-sites", "--site", s["site"],
                 "--key", f"@{key}", "--workdir", str(self.work / f"agent-{s['site']}")],
                cwd=settings.BASE_DIR, env=processes.env(self.work / "home"), stdout=log, stderr=subprocess.STDOUT,
                start_new_session=True))
        self.out(f"a Flower SuperLink on {address} and {SITES} site agents (real processes), each with the secret "
                 "the officer handed it (POST .../sites/{site}/secret/)")

    def train(self, bob, training: dict, central: dict | None) -> None:
        """The federated run at DP-SGD's target epsilon, its rounds as they come, both accuracies."""
        params = {**PARAMS, "target": training["target"], "target_threshold": training["target_threshold"],
                  "features": training["features"], "target_epsilon": training["target_epsilon"]}
        self.out(f"   bob: the same question across the 5 sites (local DP: each site runs DP-SGD on its rows), "
                 f"target epsilon {params['target_epsilon']}, {params['rounds']} round of {params['local_epochs']} local epochs")
        t0 = time.monotonic()
        r = bob.post("/api/requests/", {"dataset": "gss-sites", "engine": "federated", "kind": "train",
                                        "params": params}, format="json")
        if r.status_code != 202:
            raise CommandError(f"federated request refused: {r.status_code} {r.content[:400]!r}")
        rid, shown, phase_sites = r.json()["id"], 0, False
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline:
            body = bob.get(f"/api/requests/{rid}/").json()
            p = body.get("progress") or {}
            if p.get("phase") == "sites" and not phase_sites:
                phase_sites = True
                self.out(f"     sites connected: {', '.join(p.get('connected') or [])}")
            for h in (p.get("history") or [])[shown:]:
                self._round(h["round"], h["epsilon_spent"], h)
                shown += 1
            if body["status"] in ("succeeded", "failed", "cancelled"):
                break
            time.sleep(0.3)
        if body["status"] != "succeeded":
            raise CommandError(f"federated training did not succeed: {body['status']} {body.get('error')}")
        res = body["result"]
        for h in res["history"][shown:]:  # rounds that ended between two reads
            self._round(h["round"], h["epsilon"], h.get("eval") or {})
        t = res["test"] or {}
        self.out(f"   {res['rounds']} round(s) in {time.monotonic() - t0:.0f} s; sites aggregated: "
                 f"{', '.join(res['sites']['connected'])}; charged rdp epsilon {body['charge']['rdp']['epsilon']:.3f}")
        fed = estimate(t.get("accuracy"), t.get("accuracy_ci95")) if t else "-"
        cen = estimate(central["test"].get("accuracy"), central["test"].get("accuracy_ci95")) if central else "-"
        self.out(f"   {'':<44} {'epsilon':>7}  held-out accuracy (DP estimates)")
        self.out(f"   {'centralized DP-SGD, the rows pooled (7b)':<44} {training['target_epsilon']:>7}  {cen}")
        self.out(f"   {'federated DP-SGD, rows kept at 5 sites':<44} {res['epsilon_spent']:>7.3f}  {fed}")

    def _round(self, n, epsilon, ev: dict) -> None:
        acc = f", DP held-out accuracy {estimate(ev['accuracy'], ev.get('accuracy_ci95'))}" if "accuracy" in ev else ""
        self.out(f"     round {n}: epsilon spent {epsilon:.3f}{acc}")

    def stop(self) -> None:
        from engines.federated import processes

        for p in self.procs:
            processes.stop(p)
        if self.superlink is not None:
            processes.stop(self.superlink)


def estimate(value, ci=None) -> str:
    """A released metric with its 95% interval, or why there is none (too few held-out rows
    to measure: the count released is within its noise of none)."""
    text = "not measurable" if value is None else f"{value:.3f}"
    return text + (f" (95% {ci[0]:.3f}-{ci[1]:.3f})" if ci else "")
