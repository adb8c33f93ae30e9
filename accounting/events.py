"""Mechanism events: what a release did, stored as plain JSON and never edited.

Modelled on Google's ``dp_accounting.dp_event``. Each event is a small frozen value
object that says *what happened*, not what it cost; accountants turn events into
epsilon. ``parse_event`` is the only way from JSON to an event and refuses anything
unknown or malformed, so a ledger can hold nothing an accountant cannot read.

Compatibility rules: the meaning of a kind or field never changes; new fields are
optional with a default that keeps old events' meaning.

JSON forms (``kind`` selects the event; every number finite, every epsilon at most
``MAX_EPSILON``, every noise multiplier at most ``MAX_NOISE_MULTIPLIER``):

- ``{"kind": "laplace", "epsilon": e}`` or ``{"kind": "laplace", "scale": b,
  "sensitivity": s}``: Laplace noise of scale b on a query of L1 sensitivity s;
  pure epsilon = s / b.
- ``{"kind": "gaussian", "noise_multiplier": z, "delta": d?}``: Gaussian noise of
  standard deviation z times the L2 sensitivity. ``delta`` (optional) is the delta at
  which (epsilon, delta) accountants (basic, advanced) charge this release; the ledger
  fills it in when absent (see ``governance.ledger``).
- ``{"kind": "subsampled_gaussian", "sample_rate": q, "noise_multiplier": z,
  "steps": T, "delta": d?}``: T steps of the Poisson-subsampled Gaussian mechanism
  (DP-SGD), each sampling every unit with probability q.
- ``{"kind": "epsilon_delta", "epsilon": e, "delta": d}``: an (e, d)-DP release of
  any kind, e.g. a table published outside the service.
- ``{"kind": "self_composed", "event": E, "count": k}``: E run k times.
- ``{"kind": "composed", "events": [E1, E2, ...]}``: each of the events once.
- ``{"kind": "no_op"}``: touches no private data; costs nothing.
- ``{"kind": "non_private"}``: a release with no DP guarantee (infinite epsilon).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from fractions import Fraction
from typing import Any, Iterator

MAX_DEPTH = 16
MAX_NODES = 2_000
MAX_COUNT = 10**9
# An epsilon above this promises nothing (e^epsilon overflows a float past ~709) and is
# surely a mistake: refused, as the service refuses any budget or request above it.
MAX_EPSILON = 1e6
# A noise multiplier above this costs nothing any float can tell from zero (alpha / 2z^2 <
# 1e-20 at every order used) and is surely a mistake; past about 1e154, z^2 overflows a float
# in independent accountants (dp_accounting, the audit export's check tool).
MAX_NOISE_MULTIPLIER = 1e12


class EventError(ValueError):
    """An event that is unknown or malformed. ``path`` says where in the JSON."""

    code = "event.invalid"

    def __init__(self, message: str, path: str = "event"):
        super().__init__(f"{path}: {message}")
        self.path = path
        self.message = message


class Event:
    """Base class of all events."""

    kind: str = ""

    def to_dict(self) -> dict[str, Any]:  # pragma: no cover - every subclass overrides
        raise NotImplementedError

    def leaves(self) -> Iterator["Event"]:
        """The non-composite events inside this one (with repetition unrolled lazily)."""
        yield self


@dataclass(frozen=True)
class LaplaceEvent(Event):
    """Laplace noise: pure epsilon-DP with epsilon = sensitivity / scale."""

    epsilon: float
    scale: float | None = None
    sensitivity: float | None = None
    kind = "laplace"

    def to_dict(self):
        if self.scale is not None:
            return {"kind": self.kind, "scale": self.scale, "sensitivity": self.sensitivity}
        return {"kind": self.kind, "epsilon": self.epsilon}


@dataclass(frozen=True)
class GaussianEvent(Event):
    """Gaussian noise, std = noise_multiplier * L2 sensitivity: (alpha, alpha/(2 z^2))-RDP."""

    noise_multiplier: float
    delta: float | None = None
    kind = "gaussian"

    def to_dict(self):
        d = {"kind": self.kind, "noise_multiplier": self.noise_multiplier}
        if self.delta is not None:
            d["delta"] = self.delta
        return d


@dataclass(frozen=True)
class SubsampledGaussianEvent(Event):
    """``steps`` rounds of the Poisson-subsampled Gaussian mechanism (Mironov et al. 2019)."""

    sample_rate: float
    noise_multiplier: float
    steps: int
    delta: float | None = None
    kind = "subsampled_gaussian"

    def to_dict(self):
        d = {
            "kind": self.kind,
            "sample_rate": self.sample_rate,
            "noise_multiplier": self.noise_multiplier,
            "steps": self.steps,
        }
        if self.delta is not None:
            d["delta"] = self.delta
        return d


@dataclass(frozen=True)
class EpsilonDeltaEvent(Event):
    """A release known only to be (epsilon, delta)-DP."""

    epsilon: float
    delta: float = 0.0
    kind = "epsilon_delta"

    def to_dict(self):
        return {"kind": self.kind, "epsilon": self.epsilon, "delta": self.delta}


@dataclass(frozen=True)
class SelfComposedEvent(Event):
    """``event`` run ``count`` times, adaptively."""

    event: Event
    count: int
    kind = "self_composed"

    def to_dict(self):
        return {"kind": self.kind, "event": self.event.to_dict(), "count": self.count}

    def leaves(self):
        yield from self.event.leaves()


@dataclass(frozen=True)
class ComposedEvent(Event):
    """Each of ``events`` once, adaptively."""

    events: tuple[Event, ...]
    kind = "composed"

    def to_dict(self):
        return {"kind": self.kind, "events": [e.to_dict() for e in self.events]}

    def leaves(self):
        for e in self.events:
            yield from e.leaves()


@dataclass(frozen=True)
class NoOpEvent(Event):
    """Reads no private data: costs nothing under every accountant."""

    kind = "no_op"

    def to_dict(self):
        return {"kind": self.kind}


@dataclass(frozen=True)
class NonPrivateEvent(Event):
    """A release with no differential-privacy guarantee: infinite epsilon."""

    kind = "non_private"

    def to_dict(self):
        return {"kind": self.kind}


def has_non_private(event: Event) -> bool:
    return any(isinstance(leaf, NonPrivateEvent) for leaf in event.leaves())


def without_non_private(event: Event) -> Event:
    """``event`` with each non-private part replaced by ``no_op``: what a ledger that
    admits non-private releases charges against the epsilon budget (see the ledger)."""
    if isinstance(event, NonPrivateEvent):
        return NoOpEvent()
    if isinstance(event, SelfComposedEvent):
        return SelfComposedEvent(without_non_private(event.event), event.count)
    if isinstance(event, ComposedEvent):
        return ComposedEvent(tuple(without_non_private(e) for e in event.events))
    return event


# --------------------------------------------------------------------------- parsing


def _number(d: dict, key: str, path: str, *, required=True, positive=True, upper=None,
            upper_open=True, allow_zero=False):
    if key not in d or d[key] is None:
        if required:
            raise EventError(f"'{key}' is required", path)
        return None
    v = d[key]
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise EventError(f"'{key}' must be a number, got {type(v).__name__}", path)
    try:
        v = float(v)
    except OverflowError:  # an int beyond float range, e.g. 10**400 from JSON
        v = math.inf if v > 0 else -math.inf
    if not math.isfinite(v):
        raise EventError(f"'{key}' must be finite, got {v}", path)
    if positive and (v < 0 or (v == 0 and not allow_zero)):
        raise EventError(f"'{key}' must be {'>= 0' if allow_zero else '> 0'}, got {v}", path)
    if upper is not None and (v >= upper if upper_open else v > upper):
        raise EventError(f"'{key}' must be {'<' if upper_open else '<='} {upper}, got {v}", path)
    return v


def _integer(d: dict, key: str, path: str) -> int:
    if key not in d:
        raise EventError(f"'{key}' is required", path)
    v = d[key]
    if isinstance(v, float) and v.is_integer():
        v = int(v)
    if isinstance(v, bool) or not isinstance(v, int):
        raise EventError(f"'{key}' must be an integer, got {v!r}", path)
    if not 1 <= v <= MAX_COUNT:
        raise EventError(f"'{key}' must be between 1 and {MAX_COUNT}, got {v}", path)
    return v


_FIELDS = {
    "laplace": {"epsilon", "scale", "sensitivity"},
    "gaussian": {"noise_multiplier", "delta"},
    "subsampled_gaussian": {"sample_rate", "noise_multiplier", "steps", "delta"},
    "epsilon_delta": {"epsilon", "delta"},
    "self_composed": {"event", "count"},
    "composed": {"events"},
    "no_op": set(),
    "non_private": set(),
}

KINDS = tuple(_FIELDS)


def parse_event(data: Any) -> Event:
    """Turn JSON data into an event, or raise ``EventError`` saying what is wrong."""
    counter = [0]
    return _parse(data, "event", 0, counter)


def parse_events(data: Any) -> list[Event]:
    """A JSON list of events (or one event) -> list of events."""
    if isinstance(data, dict):
        data = [data]
    if not isinstance(data, list):
        raise EventError("expected an event object or a list of events", "events")
    counter = [0]
    return [_parse(item, f"events[{i}]", 0, counter) for i, item in enumerate(data)]


def _parse(data: Any, path: str, depth: int, counter: list[int]) -> Event:
    counter[0] += 1
    if counter[0] > MAX_NODES:
        raise EventError(f"too many events (at most {MAX_NODES})", path)
    if depth > MAX_DEPTH:
        raise EventError(f"events nested too deeply (at most {MAX_DEPTH})", path)
    if not isinstance(data, dict):
        raise EventError(f"an event must be a JSON object, got {type(data).__name__}", path)
    kind = data.get("kind")
    if not isinstance(kind, str) or kind not in _FIELDS:  # a list or dict kind is unhashable
        raise EventError(f"unknown kind {kind!r}; known kinds: {', '.join(KINDS)}", path)
    extra = set(data) - _FIELDS[kind] - {"kind"}
    if extra:
        raise EventError(f"unknown field(s) for {kind}: {', '.join(sorted(map(str, extra)))}", path)

    if kind == "laplace":
        eps = _number(data, "epsilon", path, required=False, upper=MAX_EPSILON, upper_open=False)
        scale = _number(data, "scale", path, required=False)
        sens = _number(data, "sensitivity", path, required=False)
        if eps is not None and (scale is not None or sens is not None):
            raise EventError("give either 'epsilon' or 'scale' and 'sensitivity', not both", path)
        if eps is None:
            if scale is None or sens is None:
                raise EventError("give 'epsilon', or both 'scale' and 'sensitivity'", path)
            eps = sens / scale
            if math.isfinite(eps) and eps > 0 and Fraction(eps) < Fraction(sens) / Fraction(scale):
                eps = math.nextafter(eps, math.inf)  # never below what the scale gives (1 / 3.0)
            if not math.isfinite(eps) or eps <= 0:
                raise EventError("sensitivity / scale must be a finite positive epsilon", path)
            if eps > MAX_EPSILON:
                raise EventError(f"sensitivity / scale must be an epsilon <= {MAX_EPSILON:g}, got {eps:g}", path)
            return LaplaceEvent(eps, scale, sens)
        return LaplaceEvent(eps)
    if kind == "gaussian":
        return GaussianEvent(
            _number(data, "noise_multiplier", path, upper=MAX_NOISE_MULTIPLIER, upper_open=False),
            _number(data, "delta", path, required=False, upper=1.0),
        )
    if kind == "subsampled_gaussian":
        return SubsampledGaussianEvent(
            _number(data, "sample_rate", path, upper=1.0, upper_open=False),
            _number(data, "noise_multiplier", path, upper=MAX_NOISE_MULTIPLIER, upper_open=False),
            _integer(data, "steps", path),
            _number(data, "delta", path, required=False, upper=1.0),
        )
    if kind == "epsilon_delta":
        eps = _number(data, "epsilon", path, upper=MAX_EPSILON, upper_open=False)
        delta = _number(data, "delta", path, required=False, upper=1.0, allow_zero=True)
        return EpsilonDeltaEvent(eps, delta or 0.0)
    if kind == "self_composed":
        if "event" not in data:
            raise EventError("'event' is required", path)
        inner = _parse(data["event"], f"{path}.event", depth + 1, counter)
        return SelfComposedEvent(inner, _integer(data, "count", path))
    if kind == "composed":
        items = data.get("events")
        if not isinstance(items, list):
            raise EventError("'events' must be a list", path)
        return ComposedEvent(tuple(
            _parse(item, f"{path}.events[{i}]", depth + 1, counter) for i, item in enumerate(items)
        ))
    if kind == "no_op":
        return NoOpEvent()
    return NonPrivateEvent()


def compose(events) -> Event:
    """One event for a list of events."""
    events = tuple(events)
    return events[0] if len(events) == 1 else ComposedEvent(events)
