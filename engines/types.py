"""Values passed between the governance service and engines (plain data, no Django)."""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Callable

Progress = Callable[[dict], None]
"""``progress({"phase": ..., "fraction": 0..1, ...})``: report progress; may raise ``Cancelled``."""


@dataclass(frozen=True)
class DatasetMeta:
    """The public metadata of a dataset: what an engine may use without charge.

    ``columns`` maps each column name to its declared spec (``type`` numeric,
    categorical, text or unit; ``lower``/``upper`` for numeric; ``domain`` for
    categorical). ``n_units`` is the number of privacy units (rows when there is no
    unit column), treated as public; ``delta`` is the dataset's budget delta;
    ``allow_pld``: the officer lets a single pre-planned run (a DP-SGD training, an MST
    synthesis) be calibrated and certified under PLD (the gate still charges it by RDP).
    ``distributed``: its rows are Parquet partitions run on the Dask cluster.
    """

    name: str
    columns: dict[str, dict]
    unit_column: str | None
    n_rows: int
    n_units: int
    delta: float
    allow_pld: bool = False
    distributed: bool = False


@dataclass(frozen=True)
class EngineRequest:
    """What the analyst asked: a ``kind`` the engine serves and its parameters (JSON)."""

    kind: str
    params: dict[str, Any]


@dataclass
class Plan:
    """What a run will cost and read, decided before any data is read.

    ``event`` is the mechanism event (JSON, see accounting.events) the run
    costs at most; ``columns`` the columns it reads (the unit column is added by the
    host when the dataset has one); ``details`` anything ``run`` needs (noise scales,
    sensitivities), JSON-serialisable because it is stored with the request.
    """

    event: dict
    columns: list[str]
    details: dict = field(default_factory=dict)

    def details_of(self, engine: str, version: int) -> dict:
        """``details``, if they are of this ``version`` of ``engine``'s plans; else
        EngineError (a request planned by another version of the service: each engine
        checks it in its ``prepare`` hook, before the read, and again in ``run``)."""
        v = self.details.get("version") if isinstance(self.details, dict) else None
        if type(v) is not int or v != version:
            raise EngineError(f"the request was planned by another version of the {engine} engine "
                              "(the service was upgraded since): submit it again")
        return self.details


@dataclass
class Release:
    """The output of a run: the answer (JSON) and, if it cost less than planned, the event
    actually spent (e.g. training that stopped early). ``officer_report`` (JSON) holds
    diagnostics computed on the private rows (e.g. a synthetic table's quality report):
    shown to privacy officers only, never to the analyst; its files go in
    ``workdir/officer``."""

    result: dict
    actual_event: dict | None = None
    officer_report: dict | None = None


class EngineError(Exception):
    """Base class of errors raised by engines."""

    code = "engine.error"


class PlanError(EngineError):
    """The request is invalid for this engine (a user error: 400, nothing charged).

    ``errors`` maps a parameter name to what is wrong with it.
    """

    code = "request.invalid"

    def __init__(self, message: str, errors: dict[str, str] | None = None):
        super().__init__(message)
        self.message = message
        self.errors = errors or {}


class UnknownEngine(PlanError):
    code = "engine.unknown"


class Cancelled(EngineError):
    """Raised from ``progress`` when the request was cancelled while running.

    An engine that stops part-way may set ``actual_event`` (the event of the work done
    so far, e.g. the training steps taken) before re-raising; the host then commits that
    instead of the whole reservation."""

    code = "request.cancelled"
    actual_event: dict | None = None


@contextmanager
def before_the_first_step():
    """A stepwise run (DP-SGD, the DP-VAE) before its first step: a cancellation heard here
    carries the no-op event, as one heard at the first step's report does, and the host
    commits nothing of the reservation (it committed the whole plan: a probe cancelled a
    DP-SGD run while it prepared its data). Only stepwise engines use it: each step they
    take is charged and shown in their progress, so the moment a cancel is heard tells
    little more than their progress does. A one-shot mechanism (an aggregate, MST, AIM)
    keeps the whole plan when cancelled after the read: free cancels there would let an
    analyst time its data-dependent computation again and again at no cost."""
    try:
        yield
    except Cancelled as c:
        c.actual_event = {"kind": "no_op"}
        raise
