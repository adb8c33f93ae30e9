"""A federated run seen from the worker: its progress per round and the sites it names.

``Recorder`` stands between the federated engine and the run's clock (``RunClock.report``):
it passes every report on, adding ``history`` (one line per round so far: epsilon spent,
the DP evaluation's accuracy and its 95% interval when that round was evaluated) and
``sites`` (connected and refused) to the training reports, so the request's ``progress``
shows the whole run so far, as a DP-SGD run shows its epochs.

``job`` is what the run's audit record names (its ``cluster`` field, through the officer
report, ``governance.ledger.trail.cluster_job``): the SuperLink, the Flower run, the sites
that were connected, the ones whose updates were aggregated, and the ones refused, with
why. Written for a success, a cancel and a failure alike.
"""

from __future__ import annotations

MAX_REFUSED = 100  # refused nodes named in progress and audit (an unregistered site may reconnect often)


class Recorder:
    def __init__(self, report, superlink: str):
        self.report = report
        self.superlink = superlink
        self.connected: list[str] = []
        self.refused: dict[str, str] = {}
        self.took_part: set[str] = set()
        self.history: list[dict] = []

    def __call__(self, update: dict) -> None:
        phase = update.get("phase")
        if phase == "sites":
            if isinstance(update.get("connected"), list):
                self.connected = sorted(map(str, update["connected"]))
            if isinstance(update.get("refused"), dict):
                self._refuse(update["refused"].items())
            elif update.get("why"):  # one node refused as it came
                self._refuse([(str(update.get("node", "")), str(update["why"]))])
            update = {"phase": "sites", "fraction": 0.0, **self.sites()}
        elif phase == "training":
            sites = update.get("sites") or {}
            self.took_part.update(map(str, sites.get("accepted") or []))
            ev = update.get("eval") or {}
            row = {"round": update.get("round"), "epsilon_spent": update.get("epsilon_spent")}
            if "accuracy" in ev:  # None: the round's held-out rows, as released, too few to measure
                row.update(accuracy=ev["accuracy"], accuracy_ci95=ev.get("accuracy_ci95"), dp=ev.get("dp"))
            if self.history and self.history[-1]["round"] == row["round"]:
                self.history[-1] = row  # the same round reported again (the engine repeats its last report)
            else:
                self.history.append(row)
            # the sites connected now (the round's own list): a site dropped mid-run was still
            # named here while the same report's not_connected named it too (a probe); the
            # audit's list stays every site that was connected
            now = sites.get("connected")
            if isinstance(now, list):
                self.connected = sorted(set(self.connected) | set(map(str, now)))
            update = {**update, "history": list(self.history),
                      "connected": sorted(map(str, now)) if isinstance(now, list) else self.connected}
        self.report(update)

    def _refuse(self, items) -> None:
        for node, why in items:
            if len(self.refused) < MAX_REFUSED:
                self.refused[str(node)] = str(why)[:300]

    def sites(self) -> dict:
        return {"connected": self.connected, "refused": sorted(set(self.refused.values()))}

    def job(self, result: dict | None = None) -> dict:
        """The officer report's ``cluster`` entry for the audit record."""
        if result:
            sites = result.get("sites") or {}
            self.connected = sorted(set(self.connected) | set(map(str, sites.get("connected") or [])))
            self._refuse((sites.get("refused") or {}).items())
            for h in result.get("history") or []:
                self.took_part.update(map(str, (h.get("sites") or {}).get("accepted") or []))
        job = {"backend": "flower", "superlink": self.superlink, "sites": {
            **self.sites(), "aggregated": sorted(self.took_part)}}
        if result and result.get("flower_run_id"):
            job["job"] = str(result["flower_run_id"])
        return job
