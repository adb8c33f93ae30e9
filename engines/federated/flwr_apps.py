"""The Flower ServerApp and ClientApp of the federated engine (flwr 1.42 Message API).

ServerApp: started by the SuperLink for a run that ``execute`` submitted with ``flwr run``;
its run config names a job directory (``job``) written by the engine, private to the
request: ``job.json`` (the plan's details, the registered sites' secrets, timeouts). It
writes ``progress.jsonl`` (one line per event: sites, refused, round) and ``result.json``
there, and stops before the next round when ``cancel`` appears in it. The ServerApp runs
on the machine of the SuperLink, which shares that directory with the Celery worker.

ClientApp: started by each site's SuperNode per message; reads its table and secret from
the SuperNode's node config (``siteapp``).
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord, Context, Message, RecordDict
from flwr.clientapp import ClientApp
from flwr.serverapp import Grid, ServerApp

from . import secagg, siteapp

MESSAGE_TYPE = {"hello": "query", "train": "train", "evaluate": "evaluate"}
POLL_SECONDS = 0.2

server_app = ServerApp()
client_app = ClientApp(mods=[secagg.site_mod])  # SecAgg+ stages: only for messages that carry them


def _pack(arrays: list[np.ndarray], meta: dict) -> RecordDict:
    rd = RecordDict({"meta": ConfigRecord({"json": json.dumps(meta)})})
    if arrays:
        rd["arrays"] = ArrayRecord([np.asarray(a) for a in arrays])
    return rd


def _unpack(content: RecordDict) -> tuple[list[np.ndarray], dict]:
    meta = json.loads(content["meta"]["json"])
    arrays = content["arrays"].to_numpy_ndarrays() if "arrays" in content else []
    return arrays, meta


class GridTransport:
    """The coordinator's transport over Flower's Grid (real SuperNodes)."""

    def __init__(self, grid: Grid):
        self.grid = grid

    def nodes(self):
        return list(self.grid.get_node_ids())

    def secure_sum(self, sends: dict, *, clip: float, rnd: int, timeout: float):
        return secagg.secure_sum(self.grid, sends, clip=clip, rnd=rnd, timeout=timeout)

    def exchange(self, sends: dict, timeout: float) -> dict:
        return self.receive(self.send(sends), timeout)

    def send(self, sends: dict) -> dict:
        """Pushes the messages: node id -> message id."""
        if not sends:
            return {}
        msgs = [Message(_pack(arrays, job), dst_node_id=n, message_type=MESSAGE_TYPE[kind])
                for n, (kind, job, arrays) in sends.items()]
        return dict(zip(sends, self.grid.push_messages(msgs)))

    def receive(self, handles: dict, timeout: float) -> dict:
        """The replies to ``handles`` (node id -> message id) that arrive within ``timeout``
        seconds (0: those already in), polled every ``POLL_SECONDS`` (Flower's own
        ``send_and_receive`` sleeps 3 s between pulls: most of a quick round)."""
        wanted = {mid: n for n, mid in handles.items()}
        out = {}
        end = time.monotonic() + timeout
        while wanted:
            for reply in self.grid.pull_messages(list(wanted)):
                node = wanted.pop(reply.metadata.reply_to_message_id, None)
                if node is None:
                    continue
                if reply.has_error():  # its reason is the ClientApp's exception, which can quote a row: not passed on
                    out[node] = f"site error {reply.error.code}"
                    continue
                try:
                    out[node] = _unpack(reply.content)
                except Exception as e:  # a malformed reply is refused like any bad one
                    out[node] = f"malformed reply: {type(e).__name__}"
            if not wanted or time.monotonic() >= end:
                break
            time.sleep(min(POLL_SECONDS, max(0.0, end - time.monotonic())))
        return out


def _site(kind: str, msg: Message, context: Context) -> Message:
    arrays, job = _unpack(msg.content)
    arrays, reply = siteapp.handle(kind, job, arrays, dict(context.node_config))
    return Message(_pack(arrays, reply), reply_to=msg)


@client_app.query()
def hello(msg: Message, context: Context) -> Message:
    return _site("hello", msg, context)


@client_app.train()
def train(msg: Message, context: Context) -> Message:
    if secagg.is_masked_fit(msg.content):  # SecAgg+'s collect stage: the update goes back to be masked
        node_config = dict(context.node_config)
        content = secagg.site_fit(msg.content, lambda job, arrays: siteapp.handle_masked(job, arrays, node_config))
        return Message(content, reply_to=msg)
    return _site("train", msg, context)


@client_app.evaluate()
def evaluate(msg: Message, context: Context) -> Message:
    return _site("evaluate", msg, context)


@server_app.main()
def main(grid: Grid, context: Context) -> None:
    from .coordinator import Coordinator

    jobdir = Path(str(context.run_config["job"]))
    job = json.loads((jobdir / "job.json").read_text())
    log = open(jobdir / "progress.jsonl", "a", buffering=1)

    def emit(event: dict) -> None:
        log.write(json.dumps(event, default=str) + "\n")

    coord = Coordinator(job["details"], job["site_keys"], GridTransport(grid), emit=emit,
                        # the job directory gone: its request ended (a cancel not answered in time)
                        cancelled=lambda: (jobdir / "cancel").exists() or not jobdir.is_dir(),
                        wait_sites_seconds=job.get("wait_sites_seconds", 30.0),
                        round_timeout=job.get("round_timeout", 120.0), min_sites=job.get("min_sites"))
    emit({"event": "started", "pid": os.getpid()})
    try:
        reason = coord.run()
    except BaseException as e:
        result = coord.result("failed")
        result["error"] = f"{type(e).__name__}: {e}"
        _write(jobdir / "result.json", result)
        raise
    _write(jobdir / "result.json", coord.result(reason))


def _write(path: Path, data: dict) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data, default=str))
    os.replace(tmp, path)
