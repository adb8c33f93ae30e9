"""What the client hands back: datasets, estimates and results, as plain objects and pandas DataFrames."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pandas as pd

if TYPE_CHECKING:  # pragma: no cover
    from .client import Client


def _remaining(budget: dict[str, Any]) -> float | None:
    """Epsilon left under the accountant that gates (the dataset's policy)."""
    accountants = budget.get("accountants") or {}
    gate = accountants.get(budget.get("policy") or "") or {}
    return gate.get("remaining_epsilon")


@dataclass(frozen=True)
class Dataset:
    """A dataset as the service shows it: public schema and the budget left."""

    name: str
    title: str
    columns: list[dict[str, Any]]
    unit_column: str
    n_rows: int | None
    n_units: int | None
    policy: str
    budget: dict[str, Any]
    raw: dict[str, Any] = field(repr=False)

    @classmethod
    def from_json(cls, body: dict[str, Any]) -> Dataset:
        return cls(name=body["name"], title=body.get("title") or "", columns=list(body.get("columns") or []),
                   unit_column=body.get("unit_column") or "", n_rows=body.get("n_rows"),
                   n_units=body.get("n_units"), policy=body.get("policy") or "", budget=body.get("budget") or {},
                   raw=body)

    @property
    def remaining_epsilon(self) -> float | None:
        """Epsilon left in the dataset's budget under its gating accountant."""
        return _remaining(self.budget)

    @property
    def schema(self) -> pd.DataFrame:
        """One row per column: name, type, bounds, domain."""
        rows = [{"name": c.get("name"), "type": c.get("type"), "lower": c.get("lower"), "upper": c.get("upper"),
                 "integer": c.get("integer"), "domain": c.get("domain")} for c in self.columns]
        return pd.DataFrame(rows, columns=["name", "type", "lower", "upper", "integer", "domain"])


def datasets_frame(datasets: list[Dataset]) -> pd.DataFrame:
    """One row per dataset: name, units, policy, budget and epsilon remaining."""
    return pd.DataFrame([{"name": d.name, "title": d.title, "n_rows": d.n_rows, "n_units": d.n_units,
                          "policy": d.policy, "budget_epsilon": d.budget.get("epsilon"),
                          "remaining_epsilon": d.remaining_epsilon} for d in datasets],
                        columns=["name", "title", "n_rows", "n_units", "policy", "budget_epsilon",
                                 "remaining_epsilon"])


@dataclass(frozen=True)
class Estimate:
    """What a request would cost, before sending it: the planned event, the charge under
    every accountant, whether the gate would admit it now and how many such requests fit."""

    event: dict[str, Any] | None
    charge: dict[str, Any]
    would_admit: bool
    fits: int | None
    request: dict[str, Any] | None
    raw: dict[str, Any] = field(repr=False)

    @classmethod
    def from_json(cls, body: dict[str, Any]) -> Estimate:
        events = body.get("events") or []
        event = events[0]["event"] if len(events) == 1 else None
        return cls(event=event, charge=body.get("total") or {}, would_admit=bool(body.get("would_admit")),
                   fits=body.get("fits"), request=body.get("request"), raw=body)

    @property
    def epsilon(self) -> float | None:
        """The charge's epsilon under the basic accountant (what the request spends alone)."""
        return (self.charge.get("basic") or {}).get("epsilon")


def aggregate_frame(result: dict[str, Any]) -> pd.DataFrame:
    """An aggregates release as a DataFrame: ``value``, ``ci_low``, ``ci_high`` (95%), one
    row per group (indexed by the group column, or by ``bin`` for a histogram), or one row."""
    def ci(pair: Any) -> tuple[Any, Any]:
        return (pair[0], pair[1]) if isinstance(pair, (list, tuple)) and len(pair) == 2 else (None, None)

    if result.get("kind") == "query":
        return query_frame(result)
    if "groups" in result:
        index = result.get("group_by") or ("bin" if result.get("kind") == "histogram" else "key")
        groups = result["groups"]
        pairs = [ci(g.get("ci95")) for g in groups]
        # built by column, the group key as the index: a group column named "value" or
        # "ci_low" is the index's name and takes no column's place
        return _float_intervals(pd.DataFrame(
            {"value": [g.get("value") for g in groups], "ci_low": [p[0] for p in pairs],
             "ci_high": [p[1] for p in pairs]},
            index=pd.Index([g.get("key") for g in groups], name=index)), ["ci_low", "ci_high"])
    low, high = ci(result.get("ci95"))
    return _float_intervals(pd.DataFrame([{"value": result.get("value"), "ci_low": low, "ci_high": high}],
                                         columns=["value", "ci_low", "ci_high"],
                                         index=pd.Index([result.get("kind")], name="kind")), ["ci_low", "ci_high"])


def _float_intervals(df: pd.DataFrame, intervals: list) -> pd.DataFrame:
    """Interval columns as floats, NaN where there is none (a quantile's, a dummy run's):
    ``df.n - df.n_ci_low`` works on every result alike. Only the intervals: a selected
    column the analyst named ``..._ci_low`` keeps its values."""
    for c in intervals:
        df[c] = pd.to_numeric(df[c], errors="coerce").astype(float)
    return df


def _unique(name: str, taken: set) -> str:
    while name in taken:
        name += "_"
    taken.add(name)
    return name


def query_frame(result: dict[str, Any]) -> pd.DataFrame:
    """A SQL query's release: the SELECT list's columns in order (named by their aliases),
    then ``<name>_ci_low`` and ``<name>_ci_high`` (95%) for every aggregate (with a ``_``
    added where the SELECT list already has a column of that name)."""
    columns = list(result.get("columns") or [])
    rows = result.get("rows") or []
    cis = result.get("ci95") or [[None] * len(columns) for _ in rows]
    names = {a.get("name") for a in result.get("aggregates") or []}
    taken = set(columns)
    interval_of = {c: (_unique(f"{c}_ci_low", taken), _unique(f"{c}_ci_high", taken))
                   for c in columns if c in names}
    data: dict = {}
    for j, c in enumerate(columns):
        data[c] = [row[j] for row in rows]
    for j, c in enumerate(columns):
        if c in interval_of:
            pairs = [ci[j] if isinstance(ci[j], (list, tuple)) and len(ci[j]) == 2 else (None, None) for ci in cis]
            low, high = interval_of[c]
            data[low], data[high] = [p[0] for p in pairs], [p[1] for p in pairs]
    order = columns + [n for c in columns if c in interval_of for n in interval_of[c]]
    frame = pd.DataFrame({n: data[n] for n in order}, columns=order)
    return _float_intervals(frame, [n for pair in interval_of.values() for n in pair])


def _has_parquet() -> bool:
    try:
        import pyarrow  # noqa: F401
    except ImportError:
        try:
            import fastparquet  # noqa: F401
        except ImportError:
            return False
    return True


class Result:
    """A request as the service last showed it (``status``, ``progress``, ``event``,
    ``charge``, ``result``), with its release as a DataFrame and its files downloadable."""

    def __init__(self, body: dict[str, Any], client: Client | None = None):
        self.raw = body
        self._client = client

    def __repr__(self) -> str:
        return (f"Result(id={self.id!r}, {self.engine}.{self.kind} on {self.dataset!r}, status={self.status!r}, "
                f"epsilon={self.epsilon!r})")

    id = property(lambda self: str(self.raw.get("id")))
    dataset = property(lambda self: self.raw.get("dataset"))
    engine = property(lambda self: self.raw.get("engine"))
    kind = property(lambda self: self.raw.get("kind"))
    params = property(lambda self: self.raw.get("params") or {})
    status = property(lambda self: self.raw.get("status"))
    progress = property(lambda self: self.raw.get("progress") or {})
    event = property(lambda self: self.raw.get("event"))
    charge = property(lambda self: self.raw.get("charge") or {})
    replayed = property(lambda self: bool(self.raw.get("replayed")))
    error = property(lambda self: self.raw.get("error"))

    @property
    def result(self) -> dict[str, Any]:
        return self.raw.get("result") or {}

    @property
    def done(self) -> bool:
        return self.status in ("succeeded", "failed", "cancelled")

    @property
    def epsilon(self) -> float | None:
        """Epsilon charged under the basic accountant (0 for a replay or a refund)."""
        return (self.charge.get("basic") or {}).get("epsilon")

    @property
    def df(self) -> pd.DataFrame:
        """The release as a DataFrame: an aggregate's values with their 95% intervals; a
        training run's epoch history; a sweep's table. A synthetic table is a file: use
        ``table()``."""
        r = self.result
        if self.engine == "aggregates":
            return aggregate_frame(r)
        if isinstance(r.get("table"), list):
            return pd.DataFrame(r["table"])
        if isinstance(r.get("history"), list):
            return pd.DataFrame(r["history"])
        raise ValueError(f"no table in this {self.engine}.{self.kind} result; its files: {self.files}")

    @property
    def files(self) -> list[str]:
        return [f["name"] for f in (self.result.get("files") or [])]

    def download(self, name: str, path: str | Path | None = None) -> Path:
        """Save a released file (``result.files``) to ``path`` (default: its name, here);
        its SHA-256 is checked against the one the service listed."""
        if self._client is None:
            raise RuntimeError("this Result has no client to download with")
        listed = {f["name"]: f for f in (self.result.get("files") or [])}
        if name not in listed:
            raise KeyError(f"{name!r} is not among this request's files: {sorted(listed)}")
        return self._client.download(self.id, name, path, sha256=listed[name].get("sha256"))

    def download_all(self, directory: str | Path = ".") -> list[Path]:
        """Save every released file into ``directory``."""
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        return [self.download(name, directory / plain_file_name(name)) for name in self.files]

    def table(self, directory: str | Path = ".") -> pd.DataFrame:
        """A synthetic table's rows: ``synthetic.parquet``, exact (downloaded into
        ``directory``, replacing a file of that name); or, with no Parquet reader installed,
        the CSV, whose text cells and column names a spreadsheet would run as a formula
        (``=``, ``+``, ``-``, ``@``; not plain numbers) start with ``'``."""
        for name, reader in (("synthetic.parquet", pd.read_parquet), ("synthetic.csv", pd.read_csv)):
            if name in self.files:
                if reader is pd.read_parquet and not _has_parquet() and "synthetic.csv" in self.files:
                    continue  # no Parquet reader here (pyarrow is a dependency, but a bare pandas may run this)
                return reader(self.download(name, Path(directory) / name))
        raise ValueError(f"this result holds no synthetic table; its files: {self.files}")


def plain_file_name(name: Any) -> str:
    """``name`` if it is one plain file name: a name from the service becomes a path here,
    and ``../x`` or ``/etc/x`` (a hostile or impersonated server) must not write outside
    the directory it is saved into."""
    if (not isinstance(name, str) or name in ("", ".", "..") or "/" in name or "\\" in name or "\x00" in name
            or Path(name).is_absolute() or Path(name).name != name):
        raise ValueError(f"the service named a file {str(name)[:200]!r}, not a plain file name: not saved")
    return name
