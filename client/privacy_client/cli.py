"""``privacy-client``: the client from a shell.

    privacy-client sql 'SELECT region, COUNT(*) AS n FROM cps GROUP BY region' --epsilon 0.5
    privacy-client sql '...' --epsilon 0.5 --estimate      # the cost only (free)
    privacy-client sql '...' --dummy                       # DuckDB on dummy rows (free)
    privacy-client datasets

``--url`` / ``--token`` default to ``PRIVACY_URL`` / ``PRIVACY_TOKEN``. The answer is printed
as a table (``--format csv`` or ``json`` for scripts). Exit status: 0 answered, 2 refused by
the service (its code and detail on stderr), 3 the service unreachable, silent or failing
(a 5xx). When a query's POST may have been admitted (its answer lost), stderr names its key:
the same command with ``--idempotency-key KEY`` gets that request, never charged twice.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from .errors import ApiError, ServerError, ServerUnreachable, WaitTimeout


def _options(args: argparse.Namespace) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name in ("epsilon", "rho", "mechanism", "max_rows_per_unit", "candidates"):
        v = getattr(args, name)
        if v is not None:
            out[name] = v
    if args.halfwidth is not None:
        out["accuracy"] = {"halfwidth": args.halfwidth}
    return out


# Control characters a terminal acts on (C0 but tab and line feed, DEL, C1): a dataset's title
# or a declared category holding ESC sequences cleared the analyst's screen or set her
# window title when printed as a table (OSC 52 would write her clipboard).
_SHOWN = {c: f"\\x{c:02x}" for c in [*range(0x00, 0x09), *range(0x0b, 0x20), *range(0x7f, 0xa0)]}
_JSON_ESCAPED = {c: f"\\u{c:04x}" for c in range(0x7f, 0xa0)}  # json escapes C0 itself


def _shown(value):
    return value.translate(_SHOWN) if isinstance(value, str) else value


def _print_frame(df, fmt: str, out) -> None:
    if fmt == "csv":  # RFC 4180's CRLF: a cell holding a CR or line feed is quoted, stays in its row
        df.to_csv(out, lineterminator="\r\n")
    elif fmt == "json":  # json escapes C0; DEL and C1 as well here
        out.write(df.reset_index().to_json(orient="records").translate(_JSON_ESCAPED) + "\n")
    else:
        shown = df.rename(index=_shown, columns=_shown)
        for name in shown.columns:
            if shown[name].dtype == object:
                shown[name] = shown[name].map(_shown)
        out.write(shown.to_string() + "\n")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="privacy-client", description="The privacy-budget service from a shell.")
    ap.add_argument("--url", default=None, help="the service (default: PRIVACY_URL, or http://localhost:8000)")
    ap.add_argument("--token", default=None, help="your API token (default: PRIVACY_TOKEN)")
    ap.add_argument("--timeout", type=_positive_seconds, default=60.0,
                    help="seconds to wait for the service to connect or to send more of an answer")
    sub = ap.add_subparsers(dest="command", required=True)
    q = sub.add_parser("sql", help="run (or price, or try on dummy rows) one SQL query")
    q.add_argument("query")
    q.add_argument("--epsilon", type=float)
    q.add_argument("--rho", type=float)
    q.add_argument("--halfwidth", type=float, help="accuracy target: the 95%% half-width")
    q.add_argument("--mechanism", choices=("laplace", "gaussian"))
    q.add_argument("--max-rows-per-unit", dest="max_rows_per_unit", type=int)
    q.add_argument("--candidates", type=int)
    q.add_argument("--estimate", action="store_true", help="print what it would cost; spend nothing")
    q.add_argument("--dummy", action="store_true", help="run it on dummy rows with DuckDB; spend nothing")
    q.add_argument("--dummy-rows", type=int, default=1000)
    q.add_argument("--wait", type=float, default=None, help="give up waiting after this many seconds")
    q.add_argument("--idempotency-key", dest="idempotency_key", default=None,
                   help="the key an earlier run printed when its POST may have been admitted: gets that request "
                        "back, never charged twice (default: a new key)")
    q.add_argument("--format", choices=("table", "csv", "json"), default="table")
    d = sub.add_parser("datasets", help="the datasets you may use and the budget left")
    d.add_argument("--format", choices=("table", "csv", "json"), default="table")
    args = ap.parse_args(argv)

    from .client import Client

    client = Client(args.url, token=args.token, timeout=args.timeout, progress=sys.stderr.isatty())
    try:
        if args.command == "datasets":
            _print_frame(client.datasets_frame(), args.format, sys.stdout)
            return 0
        options = _options(args)
        if args.estimate:
            est = client.estimate_sql(args.query, **options)
            sys.stdout.write(json.dumps({"would_admit": est.would_admit, "fits": est.fits, "charge": est.charge,
                                         "request": est.request}, indent=2) + "\n")
            return 0
        if args.dummy:
            result = client.sql(args.query, dummy=True, dummy_rows=args.dummy_rows, **options)
        else:
            result = client.sql(args.query, timeout=args.wait, idempotency_key=args.idempotency_key, **options)
        _print_frame(result.df, args.format, sys.stdout)
        if not args.dummy and args.format == "table":
            sys.stderr.write(f"request {result.id}: epsilon {result.epsilon}\n")
        return 0
    except (ServerUnreachable, ServerError) as e:
        sys.stderr.write(f"privacy-client: {e}\n")
        _key_hint(e)
        return 3
    except ApiError as e:
        sys.stderr.write(f"privacy-client: {e}\n")
        _key_hint(e)
        part = e.body.get("part") if isinstance(e.body, dict) else None
        errors = e.body.get("errors") if isinstance(e.body, dict) else None
        if part:
            sys.stderr.write(f"  part: {part}\n")
        if errors:
            for k, v in list(errors.items())[:10]:
                sys.stderr.write(f"  {k}: {v}\n")
        return 2
    except WaitTimeout as e:
        sys.stderr.write(f"privacy-client: {e}\n")
        _key_hint(e)
        return 3
    except ValueError as e:  # the query names no dataset, a file name refused, ...
        sys.stderr.write(f"privacy-client: {e}\n")
        return 2


def _key_hint(e: ApiError | WaitTimeout) -> None:
    """The key that gets the query's request back, when it was or may have been admitted (a
    wait given up: it goes on)."""
    key = getattr(e, "idempotency_key", None)
    if key and (isinstance(e, WaitTimeout) or e.body.get("may_have_been_admitted")):
        sys.stderr.write(f"  run the same command with --idempotency-key {key} to get that request, never "
                         "charged twice\n")


def _positive_seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not 0 < value < float("inf"):
        raise argparse.ArgumentTypeError(f"must be a number of seconds above 0, got {text!r}")
    return value


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
