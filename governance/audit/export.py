"""Audit exports: JSON (re-verifiable), CSV (one row per record) and PDF (for people).

The JSON export (``FORMAT``) is what a third party needs to check the service without
trusting it: every record with its mechanism event, charge, running totals and hashes,
the dataset's budget and policy, the accounting rules, and the chain's verification
result as the service saw it. ``tools/recompose_audit.py`` re-composes the events with an
independent accountant and re-hashes the chain. Shape::

    {"format": "privacy-audit/1", "generated_at": ISO, "generated_by": username,
     "hashing": {"algorithm": "sha256", "canonical": "...", "genesis": "000..."},
     "accounting": {"basic": {"theorem": ...}, "advanced": {...}, "rdp": {...}},
     "verification": {"ok", "datasets", "records", "heads", "first_broken", "problems"},
     "datasets": [{"name", "title", "unit_column", "n_units", "sha256",
                   "budget": {"epsilon", "delta", "policy", "delta_auto"},
                   "head": {"seq", "hash"},
                   "totals": {"at_delta", "basic": {"epsilon", "delta"}, ...},   # committed, now
                   "spent_filter": {"basic": eps, ...},  # what each accountant's filter charges
                   "refined": {"rdp": {"epsilon", "order", "at_delta"},   # plain RDP, order off the grid
                               "charges": [{"seq", "epsilon", "order", "at_delta"}]},  # each commit's
                   "counts": {"commit", "release", "refuse", "replay", "site_key", "settings", "grant",
                              "non_private"},
                   "records": [{...record body..., "hash"}]}]}
"""

from __future__ import annotations

import csv
import io
import json
import math
from collections.abc import Iterator
from datetime import UTC, datetime

from accounting import ACCOUNTANTS
from accounting.costs import Cost
from engines.spreadsheet import formula_safe

from ..core.batched import batched
from ..core.security import all_shown, json_c1_escaped
from ..core.snapshot import snapshot
from ..ledger import trail
from ..ledger.limits import Limit
from ..models import AuditRecord, Budget, Dataset
from .verification import verify

CSV_COLUMNS = ("dataset", "seq", "at", "action", "outcome", "actor", "engine", "kind", "request", "ledger_entry",
               "reference", "reason", "detail", "epsilon_basic", "epsilon_advanced", "epsilon_rdp", "total_epsilon_basic",
               "total_epsilon_advanced", "total_epsilon_rdp", "non_private", "event", "params", "result_sha256",
               "worker", "requested_at", "prev_hash", "hash")


def accounting_rules() -> dict:
    from accounting.rdp_math import ORDERS

    rules = {name: {"theorem": acc.THEOREM, "gates_with": "filter_epsilon", "doc": (acc.__doc__ or "").strip()}
             for name, acc in ACCOUNTANTS.items()}
    rules["rdp"]["orders"] = [_num(float(a)) for a in ORDERS]
    return rules


def dataset_export(ds: Dataset, budget: Budget, *, with_records: bool = True) -> dict:
    records = [_exported(rec, ds.name) for rec in _records(ds)] if with_records else []
    return {**_facts(ds), **_summary(ds, budget), "records": records}


def _digested(ds: Dataset, budget: Budget) -> dict:
    """``dataset_export`` for the PDF report: the records read once into what the report
    shows of them (``pdf.digest``), none of them held but the last few."""
    from .pdf import digest

    n = AuditRecord.objects.filter(dataset=ds).count()
    return {**_facts(ds), **_summary(ds, budget), "digest": digest((_exported(r, ds.name) for r in _records(ds)), n)}


def _records(ds: Dataset):
    return AuditRecord.objects.filter(dataset=ds).order_by("seq").iterator(chunk_size=STREAM_RECORDS)


def _facts(ds: Dataset) -> dict:
    """What the dataset's export says of it before its records."""
    return {
        "name": ds.name, "title": ds.title, "unit_column": ds.unit_column or None, "n_units": ds.n_units,
        "sha256": ds.sha256,
        "budget": {"epsilon": ds.budget_epsilon, "delta": ds.budget_delta, "policy": ds.policy,
                   "delta_auto": ds.delta_auto, "approx_delta_share": ds.approx_delta_share},
    }


def _summary(ds: Dataset, budget: Budget) -> dict:
    """The chain's head, totals and counts: a pass over the records that keeps none of them
    (the committed events' summary only)."""
    counts = {a: 0 for a in AuditRecord.Action.values} | {"non_private": 0}
    committed_events = []
    last_totals = None
    for rec in AuditRecord.objects.filter(dataset=ds).order_by("seq").only(
            "seq", "action", "non_private", "totals", "event").iterator(chunk_size=STREAM_RECORDS):
        counts[rec.action] += 1
        counts["non_private"] += rec.action == "commit" and rec.non_private
        last_totals = rec.totals
        if rec.action == "commit":
            committed_events.append((rec.seq, rec.event, (rec.totals or {}).get("at_delta")))
    # as the gate judged it: a field just past its limit (admitted by the exact sums) at the limit
    committed = Limit.of_dataset(ds).clamped(Cost.from_json(budget.committed))
    return {
        "head": {"seq": budget.audit_seq, "hash": budget.audit_head or trail.GENESIS},
        "totals": last_totals or trail.totals_of(committed, ds.budget_delta),
        "spent_filter": {name: _num(acc.filter_epsilon(committed, ds.budget_delta, ds.approx_delta_share))
                         for name, acc in ACCOUNTANTS.items()},
        "refined": refined_totals(committed, committed_events, ds.budget_delta),
        "counts": counts,
    }


def refined_totals(committed: Cost, commits: list, delta: float) -> dict:
    """The committed events' plain RDP composition at ``delta`` with the order refined off
    the grid (``limits.refined``), and each commit's own at its record's delta: tighter
    than the records' ``totals`` and ``charge`` (the grid), any order being valid for a
    report. Outside the hashed records (which keep the grid: their totals are written on
    every record, refusals and replays at admission too, where an O(history) refinement
    does not belong); each figure is a function of hashed events, which the tool
    re-derives at the stated order. ``commits``: (seq, event, at_delta) of each commit."""
    from accounting.events import compose, parse_event

    from ..ledger.limits import refined
    from ..ledger.refined_reports import event_refined

    try:
        r = refined(committed, delta, compose([parse_event(e) for _, e, _ in commits]))
    except ValueError:  # an unreadable event: the records' checks say which
        return {}
    charges = []
    for seq, e, at in commits:
        try:
            charges.append({"seq": seq, **_renamed(event_refined(e, at)), "at_delta": at})
        except (ValueError, TypeError):  # no delta in its totals, or an event without stated deltas
            continue
    return {"rdp": {**_renamed(r), "at_delta": delta}, "charges": charges}


def _renamed(r: dict) -> dict:
    return {"epsilon": r["refined_epsilon"], "order": r["refined_order"]}


def _num(x: float):
    return x if math.isfinite(x) else str(x)


def build(datasets, user=None, *, with_records: bool = True) -> dict:
    """The export of ``datasets`` (a queryset or list), verified first."""
    with snapshot():  # the verification and the records of one moment (core.snapshot)
        return _build(_read_again(datasets), user, lambda d, b: dataset_export(d, b, with_records=with_records))


def build_digested(datasets, user=None) -> dict:
    """``build``'s export with each dataset's records digested as they are read
    (``_digested``): what the PDF report needs, its memory not growing with the trail
    (the PDF of ``build`` held every record: 950 MB at 100,000)."""
    with snapshot():
        return _build(_read_again(datasets), user, _digested)


def pdf(datasets, user=None) -> bytes:
    """The PDF report of ``datasets``."""
    from .pdf import render_pdf

    return render_pdf(build_digested(datasets, user))


def _read_again(datasets) -> list[Dataset]:
    """``datasets`` as the snapshot sees them."""
    datasets = list(datasets)
    fresh = {d.pk: d for d in Dataset.objects.filter(pk__in=[d.pk for d in datasets])}
    return [fresh[d.pk] for d in datasets if d.pk in fresh]


def _build(datasets: list, user, part) -> dict:
    """The export with ``part(dataset, budget)`` for each dataset."""
    verification = verify(datasets, stop_at_first=False)
    budgets = {b.pk: b for b in Budget.objects.filter(pk__in=[d.pk for d in datasets])}
    return {**_preamble(user), "verification": verification.as_dict(),
            "datasets": [part(d, budgets[d.pk]) for d in datasets]}


def _preamble(user) -> dict:
    return {
        "format": trail.FORMAT,
        "generated_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "generated_by": user.get_username() if user is not None else "",
        "hashing": {"algorithm": "sha256", "genesis": trail.GENESIS,
                    "canonical": 'json.dumps(record without "hash", sort_keys=True, separators=(",", ":"), '
                                 "ensure_ascii=False).encode()"},
        "accounting": accounting_rules(),
    }


def to_json(export: dict) -> bytes:
    return _json(export).encode()


def _json(value) -> str:
    """Compact: json's C encoder (an indent runs the pure-Python one, 5x slower)."""
    return json_c1_escaped(json.dumps(value, ensure_ascii=False, allow_nan=False))


def _cell(value) -> str:
    """A CSV cell that a spreadsheet will not run: formula-like text gets a leading quote;
    directional formatting characters and control characters but line feed are written as
    their escapes (``all_shown``: a JSON cell keeps its value; the JSON
    export has them exact)."""
    if value is None:
        return ""
    if isinstance(value, (dict, list)):
        value = json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return formula_safe(all_shown(str(value)))


def to_csv(export: dict) -> bytes:
    return _csv_text([CSV_COLUMNS, *(_csv_row(ds["name"], r) for ds in export["datasets"] for r in ds["records"])])


def _csv_text(rows) -> bytes:
    """RFC 4180's CRLF line ends: Python's writer quotes a cell holding a character of the
    line terminator, so a lone CR in a reference is quoted too (with "\n" alone it went out
    bare, and a spreadsheet or csv.reader split the record in two: a probe's officer shaped
    the auditor's rows with one)."""
    buf = io.StringIO()
    csv.writer(buf, lineterminator="\r\n").writerows(rows)
    return buf.getvalue().encode()


def _csv_row(dataset: str, r: dict) -> list:
    charge, totals = r.get("charge") or {}, r.get("totals") or {}
    return [_cell(v) for v in (
        dataset, r["seq"], r["at"], r["action"], r["outcome"], r["actor"], r["engine"], r["kind"],
        r["request"], r["ledger_entry"], r["reference"], r["reason"], r.get("detail"),
        *((charge.get(a) or {}).get("epsilon") for a in ("basic", "advanced", "rdp")),
        *((totals.get(a) or {}).get("epsilon") for a in ("basic", "advanced", "rdp")),
        r["non_private"], r["event"], r["params"], r["result_sha256"], r["worker"], r["requested_at"],
        r["prev_hash"], r["hash"])]


STREAM_RECORDS = 1000  # records per piece of a streamed export


def stream(datasets, user, fmt: str) -> Iterator[bytes]:
    """The JSON or CSV export of ``datasets`` in pieces, read in one snapshot: what
    ``to_json(build(...))`` or ``to_csv(...)`` give (the JSON's keys in another order),
    without holding the trail. Records come first, ``STREAM_RECORDS`` at a time, at once
    (a proxy's read timeout never waits on the verification); each dataset's summary
    follows its records (a second pass, keeping none), the verification comes last (a
    third). Memory grows with the commits' summary alone (their refined charges, about 1 KB
    each), the CSV's with nothing (``build`` held every record, then its text, then its
    bytes: 1 GB at 68,000 records, its first byte after the whole)."""
    with snapshot():
        datasets = _read_again(datasets)
        if fmt == "csv":
            yield _csv_text([CSV_COLUMNS])
            for d in datasets:
                for recs in batched(_records(d), STREAM_RECORDS):
                    yield _csv_text([_csv_row(d.name, _exported(rec, d.name)) for rec in recs])
            return
        yield (_json(_preamble(user))[:-1] + ', "datasets": [').encode()  # the object left open
        for i, d in enumerate(datasets):
            yield ((", " if i else "") + _json(_facts(d))[:-1] + ', "records": [').encode()  # the dataset left open
            for j, recs in enumerate(batched(_records(d), STREAM_RECORDS)):
                yield ((", " if j else "") + ", ".join(_json(_exported(rec, d.name)) for rec in recs)).encode()
            yield ("], " + _json(_summary(d, Budget.objects.get(pk=d.pk)))[1:]).encode()  # closes the dataset
        yield ('], "verification": ' + _json(verify(datasets, stop_at_first=False).as_dict()) + "}").encode()


def _exported(rec: AuditRecord, dataset_name: str) -> dict:
    return trail.hashed_body(rec, dataset_name) | {"hash": rec.hash}


FORMATS = {"json": ("application/json", to_json), "csv": ("text/csv; charset=utf-8", to_csv)}
EXPORT_FORMATS = ("json", "csv", "pdf")  # FORMATS and the PDF report


def datasets_named(names) -> list:
    """The datasets ``names`` (all of them for none or ``["all"]``), in name order;
    ``LookupError`` naming the ones that do not exist. A name given twice is one dataset
    (not its records twice in the export)."""
    names = list(dict.fromkeys(names or ()))
    if not names or list(names) == ["all"]:
        return list(Dataset.objects.order_by("name"))
    found = {d.name: d for d in Dataset.objects.filter(name__in=names)}
    missing = [n for n in names if n not in found]
    if "all" in missing:  # (a probe's ?dataset=all&dataset=clinic was told "no dataset named all")
        raise LookupError("dataset 'all' stands for every dataset: give it alone, or name the datasets")
    if missing:
        raise LookupError(f"no dataset named {', '.join(str(n)[:100] for n in missing[:5])}")
    return [found[n] for n in names]


def http_response(datasets, user, fmt: str):
    """The export as a download (``audit-<dataset or all>.<fmt>``): JSON and CSV streamed
    (``stream``), the PDF whole (``pdf``)."""
    from django.http import HttpResponse, StreamingHttpResponse

    if fmt in FORMATS:
        response = StreamingHttpResponse(stream(datasets, user, fmt), content_type=FORMATS[fmt][0])
    else:
        response = HttpResponse(pdf(datasets, user), content_type="application/pdf")
    name = datasets[0].name if len(datasets) == 1 else "all"
    response["Content-Disposition"] = f'attachment; filename="audit-{name}.{fmt}"'
    return response


def page_response(names, user, fmt: str):
    """A web page's export download (the officer's and the auditor's): a plain-text 400
    without a dataset or with an unknown format, 404 naming a dataset that does not exist."""
    from django.http import HttpResponse

    if fmt not in EXPORT_FORMATS or not names:
        return HttpResponse("name a dataset (or all) and a format: json, csv or pdf", status=400,
                            content_type="text/plain")
    try:
        datasets = datasets_named(names)
    except LookupError as e:
        return HttpResponse(str(e), status=404, content_type="text/plain")
    return http_response(datasets, user, fmt)


def render(export: dict, fmt: str) -> tuple[bytes, str]:
    """(bytes, content type) of the export in ``fmt`` (json, csv or pdf)."""
    if fmt == "pdf":
        from .pdf import render_pdf

        return render_pdf(export), "application/pdf"
    content_type, fn = FORMATS[fmt]
    return fn(export), content_type
