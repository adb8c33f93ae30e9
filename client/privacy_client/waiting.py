"""Waiting for a request: long-poll when the service holds the answer, backoff otherwise, a progress bar.

Each status read asks ``GET /api/requests/{id}/?wait=S``. A service that supports the
long-poll holds the answer until the request is final or S seconds pass; one that does
not answers at once, and the client then sleeps out the rest of its backoff delay
(``first`` seconds, times ``factor`` after each read, at most ``cap``). The same loop works
against both, so nothing needs switching when the service gains ``?wait=``: a read that
took as long as the delay is followed by no sleep. ``Backoff(long_poll=0)`` turns the
parameter off.

The bar is ``tqdm.auto`` (a text bar in a terminal, a widget in Jupyter with ipywidgets) when tqdm is
installed (``pip install privacy-client[progress]``), showing the request's
``progress.fraction`` and ``phase``; without tqdm, waiting is silent.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Protocol


@dataclass(frozen=True)
class Backoff:
    """Delays between status reads, and the long-poll each read asks for."""

    first: float = 0.05
    factor: float = 1.6
    cap: float = 2.0
    # the service holds a read until the request is final (at most 30 s); 2 s keeps the bar fresh
    long_poll: float = 2.0

    def delays(self):
        delay = self.first
        while True:
            yield delay
            delay = min(self.cap, delay * self.factor)


class ProgressSink(Protocol):
    def update(self, body: dict[str, Any]) -> None: ...

    def close(self) -> None: ...


class _Silent:
    def update(self, body: dict[str, Any]) -> None:
        pass

    def close(self) -> None:
        pass


class _Callback:
    def __init__(self, fn: Callable[[dict[str, Any]], Any]):
        self.fn = fn

    def update(self, body: dict[str, Any]) -> None:
        self.fn(body)

    def close(self) -> None:
        pass


class _Bar:
    """A tqdm.auto bar over 0..100% of the request's progress, its phase as the postfix."""

    def __init__(self, tqdm_cls: Any, label: str):
        self.bar = tqdm_cls(total=100, desc=label, unit="%", leave=True,
                            bar_format="{desc}: {percentage:3.0f}%|{bar}| {elapsed} {postfix}")
        self.last = 0

    def update(self, body: dict[str, Any]) -> None:
        progress = body.get("progress") or {}
        fraction = progress.get("fraction")
        if body.get("status") == "succeeded":
            fraction = 1.0
        phase = progress.get("phase") or body.get("status") or ""
        epochs = progress.get("epochs")
        if isinstance(epochs, list) and epochs and isinstance(epochs[-1], dict) and "epsilon" in epochs[-1]:
            phase = f"{phase} epoch {epochs[-1].get('epoch')} eps {epochs[-1]['epsilon']:.3g}"
        elif progress.get("round") is not None:  # a federated run
            phase = f"{phase} {round_text(progress)}"
        self.bar.set_postfix_str(str(phase)[:72], refresh=False)
        if isinstance(fraction, (int, float)):
            n = max(self.last, min(100, int(round(float(fraction) * 100))))
            if n > self.last:
                self.bar.update(n - self.last)
                self.last = n
        self.bar.refresh()

    def close(self) -> None:
        self.bar.close()


def round_text(progress: dict[str, Any]) -> str:
    """A federated run's progress in a few words: the round, epsilon spent so far, the
    sites that sent an accepted update, and the last DP evaluation with its 95% interval,
    e.g. ``round 3/5 eps 1.2 sites 4 acc 0.71 [0.66, 0.76]``."""
    text = f"round {progress.get('round')}/{progress.get('rounds')}"
    eps = progress.get("epsilon_spent")
    if isinstance(eps, (int, float)):
        text += f" eps {eps:.3g}"
    sites = progress.get("sites")
    if isinstance(sites, dict) and isinstance(sites.get("accepted"), list):
        text += f" sites {len(sites['accepted'])}"
    evals = [h for h in progress.get("history") or [] if isinstance(h, dict) and h.get("accuracy") is not None]
    if evals:
        last = evals[-1]
        ci = last.get("accuracy_ci95")
        text += f" acc {last['accuracy']:.2f}"
        if isinstance(ci, list) and len(ci) == 2:
            text += f" [{ci[0]:.2f}, {ci[1]:.2f}]"
    return text


def progress_sink(progress: Any, label: str) -> ProgressSink:
    """``True``: a bar if tqdm is installed; ``False``/``None``: nothing; a callable: called
    with each status read (the request as JSON)."""
    if callable(progress):
        return _Callback(progress)
    if not progress:
        return _Silent()
    try:
        from tqdm.auto import tqdm
    except ImportError:  # the optional dependency is absent: wait silently
        return _Silent()
    return _Bar(tqdm, label)
