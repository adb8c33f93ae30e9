"""A dataset's schema: the draft inferred from the table, and the officer's version validated.

The inferred schema is a draft. Numeric bounds are never inferred (the min and max of the
private data are themselves private); categorical domains are proposed from the data
and must be reviewed by the privacy officer before the dataset is activated, because a
domain read from the data can reveal a rare value.
"""

from __future__ import annotations

import decimal
import json
import math
import re

import pyarrow as pa
import pyarrow.compute as pc

from engines.columns import null_count, unit_ids
from engines.validation import span_error
from engines.synthesis.encoding import grid_decimals, holds_a_grid_value

from ..core.errors import InvalidDataset
from .files import MAX_COLUMNS

COLUMN_TYPES = ("numeric", "categorical", "text", "unit")
MAX_DOMAIN = 1000
MAX_DECLARED_DOMAIN = 10_000
# A domain value's length at most (characters): a value is a category's label, listed with
# the dataset and repeated in its dummy rows; a 50 MB cell proposed as a category made
# every dataset listing 52 MB and a 10-row preview 314 MB.
MAX_DOMAIN_VALUE_CHARS = 1_000
MAX_DECIMALS = 9  # numeric values on a grid of 10**-decimals (synthesis keeps them there)

# --------------------------------------------------------------------------- schema


def _is_numeric(t: pa.DataType) -> bool:
    return pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_decimal(t)


def infer_schema(table: pa.Table, unit_column: str = "", carriers: dict[str, int] | None = None) -> dict:
    """A draft schema: types from Arrow; categorical domains proposed from the data
    (``domain_from_data``), and whether a numeric column holds integers from its type in
    the file (``integer_from_data``; until the officer declares ``integer``). A text,
    time or duration column whose values are held by few units each (``identifying``: a
    name, an e-mail address, an ID, an ID repeated on a person's rows) is proposed as text:
    as a domain, its values would name the units to every analyst and come back in
    synthetic rows as they are. ``carriers``: per column, the units holding a value
    (default: counted on ``table``, which must then be the whole table)."""

    def held(name: str) -> int:
        if carriers is not None:
            return carriers.get(name, 0)
        return _carriers(table, name, unit_column)

    cols = []
    for field in table.schema:
        name, t = field.name, field.type
        if name == unit_column:
            cols.append({"name": name, "type": "unit"})
        elif _is_numeric(t):
            # the file's column type says whether it holds integers: in a CSV that is read from
            # the values (one 12.5, or one null, and it is not), so it is flagged as from the data
            cols.append({"name": name, "type": "numeric", "lower": None, "upper": None,
                         "integer": pa.types.is_integer(t), "integer_from_data": True})
        elif pa.types.is_boolean(t):
            cols.append({"name": name, "type": "categorical", "domain": [False, True]})
        elif _is_moment(t) and len(uniq := pc.unique(table.column(name).drop_null())) <= MAX_DOMAIN and not identifying(
                len(uniq), held, name):
            # proposed as the text they are matched as (``_unmatched_text``): 01:00:00.000;
            # a date or timestamp as Arrow writes it, which reads back as the same value
            # (2024-02-29, 2024-02-29 12:00:00.000000Z); they were proposed as text, usable
            # in no WHERE, GROUP BY or synthetic table until each value was typed by hand
            cols.append({"name": name, "type": "categorical", "domain_from_data": True,
                         "domain": [str(v) for v in uniq.take(pc.sort_indices(uniq)).cast(pa.string()).to_pylist()]})
        elif pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_dictionary(t):
            col = table.column(name)
            if pa.types.is_dictionary(t):
                col = col.cast(pa.string())
            uniq = pc.unique(col.drop_null())
            long = len(uniq) and pc.max(pc.utf8_length(uniq)).as_py() > MAX_DOMAIN_VALUE_CHARS
            if len(uniq) <= MAX_DOMAIN and not long and not identifying(len(uniq), held, name):
                try:
                    values = [str(v) for v in uniq.to_pylist()]
                except UnicodeDecodeError:  # a Parquet string column that is not UTF-8
                    raise InvalidDataset(f"column {name!r} holds text that is not valid UTF-8") from None
                if any("\x00" in v for v in values):
                    raise InvalidDataset(f"column {name!r} holds NUL characters (\\u0000): the file is not text "
                                         "the service can store")
                cols.append({"name": name, "type": "categorical", "domain": sorted(values),
                             "domain_from_data": True})
            else:
                cols.append({"name": name, "type": "text"})
        else:
            cols.append({"name": name, "type": "text"})
    return {"columns": cols}


def _is_moment(t: pa.DataType) -> bool:
    """A date, timestamp, time of day or duration (not an interval: Arrow writes none)."""
    return pa.types.is_date(t) or pa.types.is_timestamp(t) or pa.types.is_time(t) or pa.types.is_duration(t)


IDENTIFYING_MIN_VALUES = 20
IDENTIFYING_UNITS_PER_VALUE = 5


def identifying(n_values: int, held, name: str) -> bool:
    """Whether a column's values would name its units: 20 values or more, held by fewer
    than 5 units each on average (``held(name)``: the units holding a value; counted only
    for such columns). An SSN per person is 1; a city is hundreds."""
    return n_values >= IDENTIFYING_MIN_VALUES and held(name) < IDENTIFYING_UNITS_PER_VALUE * n_values


def _carriers(table: pa.Table, name: str, unit_column: str) -> int:
    """The units of ``table`` holding a value in column ``name`` (its rows without a unit column)."""
    valid = pc.is_valid(table.column(name))
    if unit_column and unit_column in table.column_names:  # ids as they compare (a dictionary's values, -0.0 as 0.0)
        return pc.count_distinct(pc.filter(unit_ids(table.column(unit_column)), valid)).as_py()
    return int(pc.sum(valid).as_py() or 0)


def is_finite_number(v) -> bool:
    """A number (not a boolean) a 64-bit float holds: finite, and an integer within a
    float's range (10**400 written out is not)."""
    if not isinstance(v, (int, float)) or isinstance(v, bool):
        return False
    try:
        return math.isfinite(v)
    except OverflowError:
        return False


def _domain_kind(v) -> str:
    """What a domain value is; a domain holds one kind (``1`` and ``"1"`` or ``true`` would
    be one value to the engines that match by string and two to the others)."""
    return "booleans" if isinstance(v, bool) else "strings" if isinstance(v, str) else "numbers"


def _unmatchable(typ: pa.DataType, domain: list) -> str | None:
    """Why a domain value can never equal a value the column's type holds, or None. The
    engines compare a value in the column's type where it fits: 2.5 against integers was
    truncated to 2 and counted the 2s; 1.5 against a decimal column and a date written in
    another form than Arrow's own text matched nothing. Refused at the declaration."""
    numbers = [v for v in domain if isinstance(v, (int, float)) and not isinstance(v, bool)]
    if pa.types.is_integer(typ) and (odd := [v for v in numbers if isinstance(v, float) and not v.is_integer()]):
        return f"the column holds integers: {odd[0]!r} matches no row"
    if pa.types.is_decimal(typ):
        for v in numbers:
            try:
                pa.array([decimal.Decimal(repr(v)) if isinstance(v, float) else v], type=typ)
            except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError):
                return f"the column holds {typ} values: {v!r} matches no row"
    numeric = pa.types.is_integer(typ) or pa.types.is_floating(typ) or pa.types.is_decimal(typ)
    if numeric and (flags := [v for v in domain if isinstance(v, bool)]):
        # true against a 0/1 integer column was compared as text ("1" with "true") and
        # matched no row, against a float column it matched 1.0 (a probe)
        return (f"the column holds {typ} values: {str(flags[0]).lower()} is not one; declare the values as "
                "numbers (1 and 0)")
    for v in [v for v in domain if isinstance(v, str)] if numeric else []:
        # a number's text is matched as Arrow writes the column's values: "00712" against a
        # CSV column of ZIP codes read as integers (712) counted 0 and made it all null in a
        # synthetic table, silently (probe CQ)
        try:
            back = pa.array([v], pa.string()).cast(typ).cast(pa.string())[0].as_py()
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError):
            back = None
        if back != v:
            return (f"the column holds {typ} values, matched as their text: {v[:100]!r} matches no row"
                    + (f" (the value is written {back!r})" if back is not None else "")
                    + "; declare the values as numbers. A CSV column of digits is read as numbers, without "
                      "leading zeros: to keep them, register the table as Parquet with the column as text")
    if pa.types.is_temporal(typ) and (texts := [v for v in domain if isinstance(v, str)]):
        if pa.types.is_time(typ) or pa.types.is_duration(typ):
            return _unmatched_text(typ, texts)
        seen: dict = {}
        for v in texts:
            try:
                value = pa.array([v], type=pa.string()).cast(typ)[0]
            except pa.ArrowInvalid:
                return (f"the column holds {typ} values: {v[:100]!r} is not one"
                        + (" (give its zone, e.g. a trailing Z for UTC)" if getattr(typ, "tz", None) else ""))
            if value in seen:  # one instant spelt twice: GROUP BY put its rows under one, WHERE found them under both
                return f"{seen[value][:100]!r} and {v[:100]!r} are one {typ} value: declare it once"
            seen[value] = v
    return None


_TIME = re.compile(r"([01][0-9]|2[0-3])(?::([0-5][0-9])(?::([0-5][0-9])(?:\.([0-9]{1,9}))?)?)?")
_PER_SECOND = {"s": 1, "ms": 10**3, "us": 10**6, "ns": 10**9}


def _time_count(text: str, unit: str) -> int:
    """A time of day (``HH[:MM[:SS[.fraction]]]``, up to nanoseconds) as a count of ``unit``
    since midnight; ValueError when it is not one or the unit cannot hold it (Python's
    ``time`` stops at microseconds: a time64[ns] value's own text was refused)."""
    m = _TIME.fullmatch(text.strip())
    if m is None:
        raise ValueError(text)
    h, mi, sec, frac = m.groups()
    ns = ((int(h) * 60 + int(mi or 0)) * 60 + int(sec or 0)) * 10**9 + int((frac or "").ljust(9, "0"))
    per = 10**9 // _PER_SECOND[unit]
    if ns % per:
        raise ValueError(text)
    return ns // per


def _unmatched_text(typ: pa.DataType, texts: list[str]) -> str | None:
    """A time of day or a duration is matched as the text Arrow writes for it (Arrow casts
    no text to these types): ``01:00:00.000`` for a time32[ms], ``3600`` for a duration.
    A value written otherwise (``01:00:00``, ``1:00``) was accepted and matched no row, in
    every engine; refused here with the spelling that matches."""
    for v in texts:
        try:
            if pa.types.is_time(typ):
                shown = pa.array([_time_count(v, typ.unit)], type=typ).cast(pa.string())[0].as_py()
            else:
                shown = str(int(v.strip()))
        except (ValueError, pa.ArrowInvalid, OverflowError):
            return f"the column holds {typ} values: {v[:100]!r} is not one"
        if shown != v:
            return (f"the column holds {typ} values, matched as written {shown!r}: write that for {v[:100]!r} "
                    "(it matches no row as written)")
    return None


def validate_schema(schema, table_schema: pa.Schema, unit_column: str, base: dict | None = None) -> dict:
    """Merge officer edits onto ``base`` and check every column; raise with all problems."""
    errors: dict[str, str] = {}
    names = table_schema.names
    types = {f.name: f.type for f in table_schema}
    merged = {c["name"]: dict(c) for c in (base or {"columns": []})["columns"]}
    if schema is not None:
        if isinstance(schema, dict) and isinstance(schema.get("columns"), list):
            if extra := sorted(set(schema) - {"columns"}, key=str):
                raise InvalidDataset(f"schema: unknown key {str(extra[0])[:100]!r} beside 'columns' (a schema is "
                                     "{\"columns\": [...]} or an object of column declarations)")
            schema = schema["columns"]
        if isinstance(schema, dict):
            # a declaration that is not an object ({"age": [0, 6]}, {"age": null}) was answered
            # 200 and stored nothing (a probe)
            for k, v in schema.items():
                if not isinstance(v, dict):
                    errors[str(k)[:200]] = (f"a column's declaration is an object such as {{\"lower\": 0, "
                                            f"\"upper\": 6}}, got {json.dumps(v)[:100]}")
            schema = [{"name": k, **v} for k, v in schema.items() if isinstance(v, dict)]
        if not isinstance(schema, list):
            raise InvalidDataset("schema must be a list of column specs or {\"columns\": [...]}")
        if len(schema) > MAX_COLUMNS:
            raise InvalidDataset(f"schema has more than {MAX_COLUMNS} columns")
        seen: set[str] = set()
        for spec in schema:
            if not isinstance(spec, dict) or not isinstance(spec.get("name"), str):
                raise InvalidDataset("each column spec must be an object with a 'name'")
            name = spec["name"]
            if name in seen:
                errors[name[:200]] = "declared twice in the schema (which one was meant?)"
                continue
            seen.add(name)
            if name not in types:
                errors[name] = "unknown column: the table has no such column"
                continue
            if name == unit_column and (spec.get("type", "unit") != "unit" or set(spec) - {"name", "type"}):
                # (it was answered 200 and left as it was)
                errors[name] = ("the privacy-unit column is declared by unit_column: its type is 'unit' and it "
                                "takes no other field")
                continue
            updated = {**merged.get(name, {"name": name}), **spec}
            if spec.get("type") and spec["type"] != merged.get(name, {}).get("type"):
                # A changed type starts from a clean spec of that type.
                updated = {"name": name, **spec}
            if "domain" in spec:
                updated.pop("domain_from_data", None)
            if "integer" in spec:
                updated.pop("integer_from_data", None)
            merged[name] = updated
    out = []
    for name in names:
        c = merged.get(name)
        if c is None:
            errors[name] = "column missing from the schema"
            continue
        typ = c.get("type")
        if name == unit_column:
            c = {"name": name, "type": "unit"}
        elif typ not in COLUMN_TYPES:
            errors[name] = f"type must be one of {', '.join(COLUMN_TYPES)}, got {typ!r}"
        elif typ == "unit":
            errors[name] = "only the privacy-unit column can have type 'unit'"
        elif typ == "numeric":
            if not _is_numeric(types[name]) and not pa.types.is_boolean(types[name]):
                errors[name] = f"column holds {types[name]}, not numbers"
            lo, hi = c.get("lower"), c.get("upper")
            if (lo is None) != (hi is None):
                errors[name] = "declare both lower and upper bounds, or neither"
            elif lo is not None:
                if not (is_finite_number(lo) and is_finite_number(hi)):
                    errors[name] = "bounds must be finite numbers"
                elif lo >= hi:
                    errors[name] = f"lower bound {lo} must be below upper bound {hi}"
                elif problem := span_error(lo, hi):
                    errors[name] = problem
        elif typ == "categorical":
            dom = c.get("domain")
            if not isinstance(dom, list) or not dom:
                errors[name] = "a categorical column needs a non-empty 'domain' list"
            elif len(dom) > MAX_DECLARED_DOMAIN:
                errors[name] = f"domain longer than {MAX_DECLARED_DOMAIN}"
            elif not all(isinstance(v, (str, bool)) or is_finite_number(v) for v in dom):
                errors[name] = "domain values must be strings, finite numbers (within a 64-bit float's range) or booleans"
            elif any(isinstance(v, str) and len(v) > MAX_DOMAIN_VALUE_CHARS for v in dom):
                errors[name] = f"a domain value is at most {MAX_DOMAIN_VALUE_CHARS:,} characters long"
            elif len(kinds := {_domain_kind(v) for v in dom}) > 1:
                errors[name] = ("domain values must be all strings, all numbers or all booleans "
                                f"(got {', '.join(sorted(kinds))})")
            elif len({v + 0.0 if _domain_kind(v) == "numbers" else v for v in dom}) != len(dom):
                errors[name] = "domain values must be distinct"
            elif pa.types.is_boolean(types[name]) and (odd := [v for v in dom if not (
                    isinstance(v, bool) or v in ("true", "false"))]):
                # every engine matches a boolean as true / false: "TRUE" (as R writes it) matched
                # no row, and a synthetic table came back all "TRUE", silently
                errors[name] = (f"the column holds booleans, matched as true and false: {str(odd[0])[:100]!r} "
                                "matches no row; declare the domain [true, false] (or \"true\", \"false\")")
            elif (odd := _unmatchable(types[name], dom)) is not None:
                errors[name] = odd
        if typ != "numeric" and name not in errors and (c.get("lower") is not None or c.get("upper") is not None):
            errors[name] = f"bounds apply only to numeric columns; this column is {typ}"
        if typ != "categorical" and name not in errors and c.get("domain") is not None:
            errors[name] = f"a domain applies only to categorical columns; this column is {typ}"
        if "sensitive" in c and not isinstance(c["sensitive"], bool):
            errors[name] = "sensitive must be true or false"
        if "nullable" in c and not isinstance(c["nullable"], bool):
            errors[name] = "nullable must be true or false"
        if "integer" in c and not isinstance(c["integer"], bool):
            errors[name] = "integer must be true or false"
        if c.get("decimals") is not None and name not in errors:
            d = c["decimals"]
            if typ != "numeric":
                errors[name] = f"decimals apply only to numeric columns; this column is {typ}"
            elif isinstance(d, bool) or not isinstance(d, int) or not 0 <= d <= MAX_DECIMALS:
                errors[name] = f"decimals must be an integer from 0 to {MAX_DECIMALS}"
            elif c.get("integer") and d != 0:
                errors[name] = "an integer column has 0 decimals"
        if typ == "numeric" and name not in errors and c.get("lower") is not None and not holds_a_grid_value(c):
            d = grid_decimals(c)
            what = "integer" if d == 0 else f"value with {d} decimals"
            errors[name] = (f"no {what} lies in [{c['lower']}, {c['upper']}]: widen the bounds or declare more "
                            "decimals")
        allowed_keys = {"name", "type", "lower", "upper", "integer", "domain", "domain_from_data", "integer_from_data",
                        "description", "sensitive", "nullable", "decimals"}
        extra = set(c) - allowed_keys
        if extra and name not in errors:
            errors[name] = f"unknown key(s): {', '.join(sorted(extra))}"
        out.append(c)
    if errors:
        raise InvalidDataset("The schema has problems.", errors=errors)
    return {"columns": out}


def null_counts(table: pa.Table, names) -> dict[str, int]:
    """Nulls (and, numeric, NaN) per column of ``names`` in ``table``."""
    return {name: null_count(table.column(name)) for name in names}


def declared_decimals(column: dict) -> int | None:
    """A numeric column's declared grid: its decimals (0 for ``integer: true``), else None."""
    return grid_decimals(column) if column.get("type", "numeric") == "numeric" else None


def check_integers(schema: dict, table: pa.Table, names=None) -> None:
    """Refuse a schema that declares a grid (``integer: true``, or ``decimals: d``) on a
    column of ``table`` holding a value off it (of ``names`` only, when given): the engines
    trust it (an integer key's groups, a quantile's whole-number interval, synthesis on the
    grid), and a column of 12.5s grouped as integers was silently in no group; ``decimals:
    0`` on values like 4.37 was taken (a probe), where ``integer: true`` was refused."""
    errors = {}
    for c in schema.get("columns", []):
        name, d = c["name"], declared_decimals(c)
        if d is None or name not in table.column_names or (names is not None and name not in names):
            continue
        col = table.column(name)
        if pa.types.is_integer(col.type) or not (pa.types.is_floating(col.type) or pa.types.is_decimal(col.type)):
            continue
        if pa.types.is_decimal(col.type) and col.type.scale <= d:
            continue
        values = pc.drop_null(col).cast(pa.float64())
        values = pc.filter(values, pc.invert(pc.is_nan(values)))
        scaled = pc.multiply(values, float(10 ** d))
        off = pc.greater(pc.abs(pc.subtract(pc.round(scaled), scaled)),
                         pc.add(pc.multiply(pc.abs(scaled), 1e-9), 1e-6))
        count = pc.sum(off).as_py() or 0
        if count:
            what = "integer: true" if c.get("integer") is True else f"decimals: {d}"
            errors[name] = (f"declared {what}, but {count:,} value{'s' if count > 1 else ''} in the table have "
                            + ("a fraction" if d == 0 else f"more than {d} decimal{'s' if d > 1 else ''}"))
    if errors:
        raise InvalidDataset("The schema has problems.", errors=errors)


def check_nulls(schema: dict, nulls: dict[str, int]) -> None:
    """Refuse a schema that declares ``nullable: false`` on a column with nulls (``nulls``:
    per column, ``null_counts``; a column not in it is not checked): the engines trust
    the declaration (synthesis never yields a null there), so a false one must not pass."""
    errors = {c["name"]: "declared nullable: false, but the table has nulls (or NaN) in this column"
              for c in schema.get("columns", []) if c.get("nullable") is False and nulls.get(c["name"])}
    if errors:
        raise InvalidDataset("The schema has problems.", errors=errors)
