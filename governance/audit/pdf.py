"""The audit export as a PDF report for people (auditors, privacy officers).

``render_pdf(export)`` takes the JSON audit export exactly as
``governance.audit.export.build`` makes it (or as it was loaded back from a file) and
returns the bytes of an A4 PDF: the chain's verification result, a summary per dataset,
each dataset's budget burn-down chart, releases per analyst and its last records, the
accounting rules and how to verify the export independently.

This module works on the plain dict: no Django, no database, so it can run on an export
file received from elsewhere. Charts are drawn with matplotlib's object API on the Agg
canvas (no pyplot: no global figure registry to leak into, safe in a threaded server),
tables and text with reportlab's platypus and its built-in fonts (Helvetica, Courier).

Everything that comes from users (references, usernames, refusal details, dataset
names) is escaped before it goes into a Paragraph, and reduced to the characters the
built-in fonts have (cp1252).
"""

from __future__ import annotations

import io
import math
import re
from datetime import datetime
from xml.sax.saxutils import escape

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.dates import AutoDateLocator, ConciseDateFormatter
from matplotlib.figure import Figure
from reportlab.lib import colors
from reportlab.lib.enums import TA_CENTER
from reportlab.lib.pagesizes import A4
from reportlab.lib.styles import ParagraphStyle
from reportlab.lib.units import mm
from reportlab.platypus import (
    CondPageBreak,
    Image,
    KeepTogether,
    PageBreak,
    Paragraph,
    SimpleDocTemplate,
    Spacer,
    Table,
    TableStyle,
)

__all__ = ["render_pdf"]

ACCOUNTANTS = ("basic", "advanced", "rdp")  # the export's order; others in an export are shown too
MAX_POINTS = 2000       # burn-down points per dataset (first, last and every k-th record)
LAST_RECORDS = 30       # records listed per dataset
MAX_ANALYSTS_TABLE = 40
MAX_ANALYSTS_CHART = 20
MAX_PROBLEMS = 20
DPI = 150

MARGIN = 15 * mm
PAGE_W, PAGE_H = A4
WIDTH = PAGE_W - 2 * MARGIN

RED = colors.HexColor("#b00020")
GREEN = colors.HexColor("#1b6e2a")
GREY = colors.HexColor("#5f6b76")
GRID = colors.HexColor("#c3c9cf")
HEAD_BG = colors.HexColor("#e6ebf0")
ZEBRA = colors.HexColor("#f7f8fa")

LINE_COLORS = {"basic": "#1f77b4", "advanced": "#ff7f0e", "rdp": "#2ca02c"}
LINE_STYLES = {"basic": "-", "advanced": (0, (4, 2)), "rdp": "-"}  # advanced dashed: it often equals basic


# --------------------------------------------------------------------------- text


def _style(name, size=9, leading=None, font="Helvetica", **kw) -> ParagraphStyle:
    return ParagraphStyle(name, fontName=font, fontSize=size, leading=leading or size * 1.3, **kw)


S = {
    "title": _style("title", 20, 24, "Helvetica-Bold", spaceAfter=6),
    "h1": _style("h1", 14, 18, "Helvetica-Bold", spaceBefore=10, spaceAfter=6),
    "h2": _style("h2", 11, 14, "Helvetica-Bold", spaceBefore=8, spaceAfter=4),
    "body": _style("body", 9, 12, spaceAfter=4),
    "small": _style("small", 7.5, 9.5, spaceAfter=3),
    "caption": _style("caption", 7.5, 9.5, "Helvetica-Oblique", textColor=GREY, spaceBefore=2, spaceAfter=6),
    "mono": _style("mono", 7, 9, "Courier", spaceAfter=2),
    "ok": _style("ok", 10, 13, "Helvetica-Bold", textColor=GREEN, spaceAfter=4),
    "bad": _style("bad", 10, 13, "Helvetica-Bold", textColor=RED, spaceAfter=4),
    "bad_small": _style("bad_small", 7.5, 9.5, textColor=RED, leftIndent=8, spaceAfter=1),
    "cell": _style("cell", 7, 8.5),
    "cell_mono": _style("cell_mono", 6.5, 8, "Courier"),
    "cell_head": _style("cell_head", 7, 8.5, "Helvetica-Bold"),
    "cell_head_c": _style("cell_head_c", 7, 8.5, "Helvetica-Bold", alignment=TA_CENTER),
}

# characters the built-in fonts lack, spelled out; anything else outside cp1252 becomes "?"
_SPELL = str.maketrans({"ε": "epsilon", "δ": "delta", "α": "alpha", "ρ": "rho", "≤": "<=", "≥": ">=",
                        "−": "-", "√": "sqrt", "∞": "inf", "∑": "sum", "·": "*"})
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def _plain(value, limit: int | None = None) -> str:
    """``value`` as text the built-in fonts can draw (not escaped: for canvas/table strings)."""
    text = "" if value is None else str(value)
    text = _CONTROL.sub(" ", text.translate(_SPELL))
    text = text.encode("cp1252", "replace").decode("cp1252")
    if limit is not None and len(text) > limit:
        text = text[: limit - 3] + "..."
    return text


def _t(value, limit: int | None = None) -> str:
    """``value`` escaped for a Paragraph (user text never becomes markup)."""
    return escape(_plain(value, limit))


def _p(markup: str, style: str = "body") -> Paragraph:
    return Paragraph(markup, S[style])


def _mono(value, style: str = "cell_mono") -> Paragraph:
    return Paragraph(_t(value), S[style])


def _mpl(value, limit: int = 24) -> str:
    """User text for a matplotlib label: no mathtext (``$``)."""
    return _plain(value, limit).replace("$", r"\$")


# --------------------------------------------------------------------------- numbers


def _num(x) -> float | None:
    """A number of the export (floats, ints, or "inf"/"nan" strings) as float; None if absent."""
    if x is None or isinstance(x, bool):
        return None
    if isinstance(x, (int, float)):
        return float(x)
    try:
        return float(x)
    except (TypeError, ValueError):
        return None


def _eps(d, acc: str) -> float | None:
    """``d[acc]["epsilon"]`` of a charge or totals dict, tolerating nulls."""
    if not isinstance(d, dict):
        return None
    sub = d.get(acc)
    return _num(sub.get("epsilon")) if isinstance(sub, dict) else None


def _fmt(x, digits: int = 4) -> str:
    v = _num(x)
    if v is None:
        return "-"
    if math.isnan(v):
        return "nan"
    if math.isinf(v):
        return "inf" if v > 0 else "-inf"
    if v == 0:
        return "0"
    if abs(v) >= 1e5 or abs(v) < 1e-3:
        return f"{v:.3g}"
    return f"{v:.{digits}g}"


def _time(text) -> datetime | None:
    try:
        return datetime.fromisoformat(str(text))
    except (TypeError, ValueError):
        return None


def _short_time(text) -> str:
    t = _time(text)
    return t.strftime("%Y-%m-%d %H:%M:%S") if t is not None else _plain(text, 19)


# --------------------------------------------------------------------------- tables


def _table(rows, widths, *, header_rows: int = 1, numeric_from: int | None = None, extra=()) -> Table:
    """A light-grid table with a shaded header; columns from ``numeric_from`` right-aligned."""
    table = Table(rows, colWidths=widths, repeatRows=header_rows, hAlign="LEFT")
    style = [
        ("FONT", (0, 0), (-1, -1), "Helvetica", 7),
        ("FONT", (0, 0), (-1, header_rows - 1), "Helvetica-Bold", 7),
        ("BACKGROUND", (0, 0), (-1, header_rows - 1), HEAD_BG),
        ("GRID", (0, 0), (-1, -1), 0.25, GRID),
        ("VALIGN", (0, 0), (-1, -1), "TOP"),
        ("TOPPADDING", (0, 0), (-1, -1), 2),
        ("BOTTOMPADDING", (0, 0), (-1, -1), 2),
        ("LEFTPADDING", (0, 0), (-1, -1), 3),
        ("RIGHTPADDING", (0, 0), (-1, -1), 3),
    ]
    if len(rows) > header_rows + 1:
        style.append(("ROWBACKGROUNDS", (0, header_rows), (-1, -1), [colors.white, ZEBRA]))
    if numeric_from is not None:
        style.append(("ALIGN", (numeric_from, header_rows), (-1, -1), "RIGHT"))
    table.setStyle(TableStyle(style + list(extra)))
    return table


def _head(*labels, center: bool = False) -> list:
    return [Paragraph(_t(x), S["cell_head_c" if center else "cell_head"]) if x else "" for x in labels]


# --------------------------------------------------------------------------- charts


def _png(fig: Figure, width: float) -> Image:
    """The figure as a PNG Image flowable ``width`` points wide (aspect kept)."""
    FigureCanvasAgg(fig)
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=DPI)
    w_in, h_in = fig.get_size_inches()
    fig.clear()
    buf.seek(0)
    return Image(buf, width=width, height=width * h_in / w_in)


def _sample(n: int, limit: int = MAX_POINTS) -> list[int]:
    """Indices of at most ~``limit`` of ``n`` records: every k-th, first and last kept."""
    if n <= limit:
        return list(range(n))
    k = -(-n // (limit - 1))
    idx = list(range(0, n, k))
    if idx[-1] != n - 1:
        idx.append(n - 1)
    return idx


def _burndown(ds: dict, accountants: list[str]) -> list:
    records = ds.get("records") or []
    budget = ds.get("budget") or {}
    policy = budget.get("policy") or ""
    cap = _num(budget.get("epsilon"))
    idx = _sample(len(records))
    times, series = [], {a: [] for a in accountants}
    for i in idx:
        rec = records[i]
        t = _time(rec.get("at"))
        if t is None:
            continue
        times.append(t)
        totals = rec.get("totals")
        for a in accountants:
            series[a].append(_eps(totals, a))
    if not times:
        return [_p("No records yet: nothing has been committed, refunded, refused or replayed.", "small")]

    def finite_max(values):
        finite = [v for v in values if v is not None and math.isfinite(v)]
        return max(finite) if finite else 0.0

    anchors = [finite_max(series.get("rdp", [])), finite_max(series.get(policy, []))]
    if cap is not None and math.isfinite(cap):
        anchors.append(cap)
    top = 1.3 * max(anchors) if max(anchors) > 0 else 1.0

    fig = Figure(figsize=(7.2, 3.1))
    ax = fig.add_subplot(1, 1, 1)
    clipped, drawn = [], {}
    for a in accountants:
        values = series[a]
        if all(v is None for v in values):
            continue
        peak = max((v for v in values if v is not None), default=0.0)
        if peak > top:
            clipped.append((a, peak))
        # inf (and anything above the axis) is drawn off the top: visibly clipped
        ys = [float("nan") if v is None or math.isnan(v) else min(v, top * 10) for v in values]
        drawn[a] = values
        label = f"{a} (gate)" if a == policy else a
        ax.step(times, ys, where="post", label=_mpl(label), color=LINE_COLORS.get(a),
                linestyle=LINE_STYLES.get(a, "-."), linewidth=2.0 if a == policy else 1.3,
                marker="o" if len(times) == 1 else None, markersize=3)
    if cap is not None and math.isfinite(cap):
        ax.axhline(cap, color="red", linestyle="--", linewidth=1.2, label="cap")
    ax.set_ylim(0, top)
    ax.set_ylabel("committed epsilon", fontsize=8)
    ax.set_xlabel("record time (UTC)", fontsize=8)
    locator = AutoDateLocator()
    ax.xaxis.set_major_locator(locator)
    ax.xaxis.set_major_formatter(ConciseDateFormatter(locator))
    ax.xaxis.get_offset_text().set_fontsize(7)
    ax.grid(True, color="#e0e0e0", linewidth=0.6)
    ax.tick_params(labelsize=7)
    ax.legend(fontsize=7, loc="best", frameon=True, framealpha=0.9, edgecolor="#dddddd")
    fig.tight_layout()
    image = _png(fig, WIDTH)

    n = len(records)
    caption = (f"Budget burn-down: committed epsilon after each record under each accountant, at the dataset's "
               f"delta ({_fmt((records[-1].get('totals') or {}).get('at_delta'))}); {n} record{'s' * (n != 1)}")
    caption += (f"; one record in {-(-n // (MAX_POINTS - 1))} plotted, first and last kept." if len(idx) < n
                else ".")
    if cap is not None:
        caption += (f" The dashed red line is the budget cap (epsilon {_fmt(cap)}); the gate compares the "
                    f"{_t(policy)} filter's epsilon ({_fmt((ds.get('spent_filter') or {}).get(policy))}) with it.")
    names = list(drawn)
    same = [(a, b) for i, a in enumerate(names) for b in names[i + 1:] if drawn[a] == drawn[b]]
    for a, b in same:
        caption += f" The {_t(a)} and {_t(b)} lines coincide."
    for a, peak in clipped:
        caption += f" The {_t(a)} line (up to {_fmt(peak)}) is clipped at the top of the axis ({_fmt(top)})."
    return [image, _p(caption, "caption")]


def _analyst_chart(rows: list) -> Image:
    rows = rows[:MAX_ANALYSTS_CHART][::-1]
    fig = Figure(figsize=(5.0, 0.6 + 0.22 * len(rows)))
    ax = fig.add_subplot(1, 1, 1)
    ax.barh(range(len(rows)), [r[1] for r in rows], color="#1f77b4", height=0.6)
    ax.set_yticks(range(len(rows)), [_mpl(r[0]) for r in rows])  # positions: equal labels stay apart
    ax.set_xlabel("releases (commit)", fontsize=7)
    ax.tick_params(labelsize=7)
    ax.grid(True, axis="x", color="#e0e0e0", linewidth=0.6)
    ax.set_axisbelow(True)
    ax.xaxis.get_major_locator().set_params(integer=True)
    fig.tight_layout()
    return _png(fig, 110 * mm)


# --------------------------------------------------------------------------- sections


def _title(export: dict) -> list:
    datasets = export.get("datasets") or []
    n_records = sum(len(ds.get("records") or []) for ds in datasets)
    out = [_p("Privacy audit report", "title")]
    meta = [
        ["Generated at", _plain(export.get("generated_at") or "-")],
        ["Generated by", Paragraph(_t(export.get("generated_by") or "-"), S["cell"])],
        ["Format", _plain(export.get("format") or "-")],
        ["Datasets", str(len(datasets))],
        ["Records", str(n_records)],
    ]
    out.append(_table(meta, [30 * mm, 80 * mm], header_rows=0,
                      extra=[("FONT", (0, 0), (0, -1), "Helvetica-Bold", 7), ("BACKGROUND", (0, 0), (0, -1), HEAD_BG)]))
    out.append(Spacer(1, 8))
    out += _verification(export.get("verification") or {})
    heads = [_head("Dataset", "Head seq", "Head hash (SHA-256 of the dataset's last record)")]
    for ds in datasets:
        head = ds.get("head") or {}
        heads.append([Paragraph(_t(ds.get("name")), S["cell"]), _plain(head.get("seq", "-")), _mono(head.get("hash"))])
    if datasets:
        out.append(_p("Publish or file these head hashes elsewhere to anchor the chains: a chain anchored nowhere else "
                      "could be rewritten whole by someone with write access to the database.", "small"))
        out.append(_table(heads, [45 * mm, 16 * mm, WIDTH - 61 * mm], numeric_from=1,
                          extra=[("ALIGN", (2, 1), (2, -1), "LEFT")]))
    return out


def _verification(v: dict) -> list:
    if v.get("ok"):
        return [_p(f"Chain verified: {_t(v.get('records', 0))} records in {_t(v.get('datasets', 0))} dataset(s) were "
                   "re-hashed and checked against the ledger; no problems found.", "ok")]
    if not v:
        return [_p("Chain verification: not included in this export.", "bad")]
    out = [_p("Chain verification FAILED.", "bad")]
    first = v.get("first_broken")
    if first:
        where = f"record {_t(first.get('seq'))}" if first.get("seq") is not None else "the chain"
        if first.get("record_id") is not None:
            where += f" (id {_t(first.get('record_id'))})"
        out.append(_p(f"First broken: dataset <b>{_t(first.get('dataset'))}</b>, {where}: "
                      f"{_t(first.get('problem'), 400)}", "bad_small"))
    problems = v.get("problems") or []
    if problems:
        out.append(_p(f"All problems found ({len(problems)}{'+' if len(problems) >= 100 else ''}):", "bad_small"))
        for problem in problems[:MAX_PROBLEMS]:
            out.append(_p(f"- {_t(problem, 400)}", "bad_small"))
        if len(problems) > MAX_PROBLEMS:
            out.append(_p(f"... and {len(problems) - MAX_PROBLEMS} more (see the verification in the JSON export).",
                          "bad_small"))
    return out


def _counts(ds: dict) -> dict:
    counts = ds.get("counts")
    if isinstance(counts, dict):
        return counts
    out = {"commit": 0, "release": 0, "refuse": 0, "replay": 0, "non_private": 0}
    for rec in ds.get("records") or []:
        a = rec.get("action")
        out[a] = out.get(a, 0) + 1
        out["non_private"] += a == "commit" and bool(rec.get("non_private"))
    return out


def _summary(datasets: list) -> list:
    out = [_p("Summary", "h1")]
    if not datasets:
        return out + [_p("This export contains no datasets.")]
    head0 = _head("", "", "Budget", "", "Committed epsilon", "", "", "Gate", "", "Records", "", "", "", "",
                  center=True)
    head1 = _head("Dataset", "Policy", "epsilon", "delta", "basic", "advanced", "rdp", "filter epsilon",
                  "remaining", "releases", "refunds", "refusals", "replays", "non-private")
    rows = [head0, head1]
    extra = [("SPAN", (2, 0), (3, 0)), ("SPAN", (4, 0), (6, 0)), ("SPAN", (7, 0), (8, 0)), ("SPAN", (9, 0), (13, 0))]
    for i, ds in enumerate(datasets, start=2):
        budget = ds.get("budget") or {}
        policy = budget.get("policy") or ""
        totals = ds.get("totals") or {}
        filt = _num((ds.get("spent_filter") or {}).get(policy))
        cap = _num(budget.get("epsilon"))
        remaining = cap - filt if cap is not None and filt is not None else None
        if remaining is not None and remaining < 0:
            extra.append(("TEXTCOLOR", (8, i), (8, i), RED))
        c = _counts(ds)
        rows.append([Paragraph(_t(ds.get("name")), S["cell"]), _plain(policy), _fmt(cap), _fmt(budget.get("delta"), 3),
                     *(_fmt(_eps(totals, a)) for a in ACCOUNTANTS), _fmt(filt), _fmt(remaining),
                     *(str(c.get(k, 0)) for k in ("commit", "release", "refuse", "replay", "non_private"))])
    widths = [32, 32, 38, 34, 40, 34, 34, 41, 35, 32, 34, 32, 46]  # fit the bold 7 pt headers
    out.append(_table(rows, [WIDTH - sum(widths), *widths], header_rows=2, numeric_from=2, extra=extra))
    out.append(_p("Committed epsilon: what each accountant reports for the committed releases, at the dataset's "
                  "delta. Filter epsilon: what the gating accountant's privacy filter has used; remaining = budget "
                  "epsilon - filter epsilon. Releases are commits, refunds are reservations released without a "
                  "result (no charge), replays serve a stored result again (no charge).", "caption"))
    return out


def _analysts(records: list) -> list[list]:
    """[actor, releases, refunds, refusals, replays, basic epsilon of the releases] per analyst."""
    stats: dict[str, list] = {}
    column = {"commit": 1, "release": 2, "refuse": 3, "replay": 4}
    for rec in records:
        actor = rec.get("actor") or ""
        row = stats.get(actor)
        if row is None:
            row = stats[actor] = [actor, 0, 0, 0, 0, 0.0]
        action = rec.get("action")
        col = column.get(action)
        if col is not None:
            row[col] += 1
        if action == "commit":
            eps = _eps(rec.get("charge"), "basic")
            if eps is not None and not math.isnan(eps):
                row[5] += eps
    return sorted(stats.values(), key=lambda r: (-r[1], -r[3], r[0]))


def _dataset_section(ds: dict, accountants: list[str]) -> list:
    name = ds.get("name")
    budget = ds.get("budget") or {}
    policy = budget.get("policy") or ""
    records = ds.get("records") or []
    out = [_p(f"Dataset {_t(name)}", "h1")]
    facts = []
    if ds.get("title") and ds.get("title") != name:
        facts.append(f"<i>{_t(ds.get('title'), 200)}</i>")
    facts.append(f"budget epsilon {_fmt(budget.get('epsilon'))}, delta {_fmt(budget.get('delta'), 3)}"
                 f"{' (automatic)' if budget.get('delta_auto') else ''}, gated by the <b>{_t(policy)}</b> accountant")
    if ds.get("n_units") is not None:
        unit = f" (unit column {_t(ds.get('unit_column'))})" if ds.get("unit_column") else ""
        facts.append(f"{_t(ds.get('n_units'))} privacy units{unit}")
    out.append(_p("; ".join(facts) + ".", "body"))
    if ds.get("sha256"):
        out.append(_p(f"Data file SHA-256: <font face='Courier'>{_t(ds.get('sha256'))}</font>", "small"))

    out.append(_p("Budget burn-down", "h2"))
    out += _burndown(ds, accountants)

    out.append(CondPageBreak(60 * mm))
    out.append(_p("Releases per analyst", "h2"))
    stats = _analysts(records)
    if not stats:
        out.append(_p("No records.", "small"))
    else:
        rows = [_head("Analyst", "Releases", "Refunds", "Refusals", "Replays", "Sum of basic epsilon charged")]
        for actor, commits, refunds, refusals, replays, eps in stats[:MAX_ANALYSTS_TABLE]:
            rows.append([Paragraph(_t(actor or "-", 80), S["cell"]), str(commits), str(refunds), str(refusals),
                         str(replays), _fmt(eps)])
        out.append(_table(rows, [60 * mm, 20 * mm, 20 * mm, 20 * mm, 20 * mm, 40 * mm], numeric_from=1))
        if len(stats) > MAX_ANALYSTS_TABLE:
            out.append(_p(f"The {MAX_ANALYSTS_TABLE} analysts with the most releases of {len(stats)}; the others are "
                          "in the JSON/CSV export.", "caption"))
        if len(stats) >= 2:
            out.append(Spacer(1, 4))
            out.append(_analyst_chart([(r[0] or "-", r[1]) for r in stats]))
            more = f" (the {MAX_ANALYSTS_CHART} with the most)" if len(stats) > MAX_ANALYSTS_CHART else ""
            out.append(_p(f"Releases per analyst{more}.", "caption"))

    out.append(CondPageBreak(50 * mm))
    out.append(_p(f"Last {min(LAST_RECORDS, len(records))} records", "h2"))
    if records:
        rows = [_head("Seq", "Time (UTC)", "Action", "Outcome", "Actor", "Engine.kind", f"epsilon ({policy})",
                      "Reference / reason", "Hash")]
        for rec in records[-LAST_RECORDS:]:
            action = rec.get("action") or ""
            if action == "refuse":
                note = ": ".join(filter(None, [_plain(rec.get("reason")), _plain(rec.get("detail"))]))
            else:
                note = _plain(rec.get("reference")) or _plain(rec.get("reason"))
            if action == "commit" and rec.get("non_private"):
                note = "[non-private] " + note
            engine = ".".join(filter(None, [_plain(rec.get("engine")), _plain(rec.get("kind"))]))
            rows.append([_plain(rec.get("seq")), _short_time(rec.get("at")), _plain(action),
                         _plain(rec.get("outcome"), 12), Paragraph(_t(rec.get("actor"), 40), S["cell"]),
                         Paragraph(_t(engine, 60), S["cell"]), _fmt(_eps(rec.get("charge"), policy)),
                         Paragraph(_t(note, 220), S["cell"]), _plain(rec.get("hash"))[:12]])
        widths = [28, 70, 32, 40, 46, 62, 40, None, 54]
        widths[7] = WIDTH - sum(w for w in widths if w)
        out.append(_table(rows, widths, extra=[
            ("ALIGN", (0, 1), (0, -1), "RIGHT"), ("ALIGN", (6, 1), (6, -1), "RIGHT"),
            ("FONT", (8, 1), (8, -1), "Courier", 6.5)]))
    out.append(_p(f"{len(records)} record{'s' * (len(records) != 1)} in this dataset's chain"
                  f"{', the last ' + str(LAST_RECORDS) + ' shown' if len(records) > LAST_RECORDS else ''}. The full "
                  "list, with each record's event, parameters, charge, running totals and hashes, is in the JSON/CSV "
                  "export.", "caption"))
    return out


def _gate_rule(doc: str) -> str:
    m = re.search(r"Gate rule:(.*?)(?:\n\s*\n|$)", doc or "", re.DOTALL)
    return " ".join(m.group(1).split()) if m else ""


def _accounting(export: dict) -> list:
    accounting = export.get("accounting") or {}
    datasets = export.get("datasets") or []
    out = [_p("Accounting rules", "h1")]
    out.append(_p("Every request names a mechanism event. When it is admitted the gate charges it to the dataset's "
                  "budget; when it is released (committed) the event is added to the dataset's committed events. "
                  "Each dataset's budget policy names the accountant that gates it:"))
    if datasets:
        rows = [_head("Dataset", "Gated by", "Budget epsilon", "Budget delta", "Filter epsilon used")]
        for ds in datasets:
            budget = ds.get("budget") or {}
            policy = budget.get("policy") or ""
            rows.append([Paragraph(_t(ds.get("name")), S["cell"]), _plain(policy), _fmt(budget.get("epsilon")),
                         _fmt(budget.get("delta"), 3), _fmt((ds.get("spent_filter") or {}).get(policy))])
        out.append(_table(rows, [60 * mm, 25 * mm, 25 * mm, 25 * mm, 30 * mm], numeric_from=2))
        out.append(Spacer(1, 6))
    for name, info in accounting.items():
        info = info if isinstance(info, dict) else {}
        gated = [ds.get("name") for ds in datasets if (ds.get("budget") or {}).get("policy") == name]
        block = [_p(_t(name), "h2"),
                 _p(f"<b>Theorem:</b> {_t(info.get('theorem') or '-')}"),
                 _p(f"<b>Gates:</b> {_t(', '.join(map(str, gated)), 600) if gated else 'no dataset in this export'}."),
                 _p(f"<b>Filter:</b> the gate composes adaptively chosen requests with the {_t(name)} privacy filter: "
                    f"a request is admitted only while the filter's epsilon, with the request added, stays within the "
                    f"budget, which keeps the guarantee valid although each request is chosen after seeing earlier "
                    f"results. The {_t(name)} totals in this report are the {_t(name)} composition of the committed "
                    f"events at the dataset's delta, which can be lower than the filter epsilon.")]
        rule = _gate_rule(info.get("doc") or "")
        if rule:
            block.append(_p(f"Gate rule (from the accountant's documentation): {_t(rule, 1500)}", "small"))
        out.append(KeepTogether(block))
    if not accounting:
        out.append(_p("The export carries no accounting rules."))
    return out


def _how_to_verify(export: dict) -> list:
    hashing = export.get("hashing") or {}
    algorithm = hashing.get("algorithm") or "sha256"
    out = [_p("How to verify", "h1")]
    out.append(_p(f"Each dataset has its own hash chain. A record's <b>hash</b> is {_t(algorithm)} over its canonical "
                  "form, the record without its <b>hash</b> key and with its <b>prev_hash</b>:"))
    out.append(_p(_t(hashing.get("canonical") or "-"), "mono"))
    out.append(_p("The first record's <b>prev_hash</b> is the genesis value"))
    out.append(_p(_t(hashing.get("genesis") or "-"), "mono"))
    out.append(_p("and every later record's <b>prev_hash</b> is the hash of the record before it; the dataset's head "
                  "(page 1) is the hash of its last record. Editing, deleting, inserting or reordering a record "
                  "breaks the chain from that record on; compare the head with one published or filed elsewhere to "
                  "detect a chain rewritten whole."))
    out.append(_p("To check this export without trusting the service, re-hash the chain and re-compose the committed "
                  "events with an independent accountant:"))
    out.append(_p("python tools/recompose_audit.py export.json", "mono"))
    out.append(_p("where export.json is the JSON audit export this report was made from. Its running totals and "
                  "charges should agree with the ones above, and its head hashes with those on page 1."))
    return out


# --------------------------------------------------------------------------- document


def render_pdf(export: dict, *, compress: bool = True) -> bytes:
    """The PDF audit report of ``export`` (the dict of ``governance.audit.export.build``).

    ``compress=False`` writes uncompressed page streams and an invariant document (no
    timestamp or random ID), for tests that look for text in the bytes.
    """
    datasets = export.get("datasets") or []
    accountants = list(ACCOUNTANTS)
    for name in export.get("accounting") or {}:
        if name not in accountants:
            accountants.append(name)
    generated = _plain(export.get("generated_at") or "", 40)

    def footer(canvas, doc):
        canvas.saveState()
        canvas.setFont("Helvetica", 7)
        canvas.setFillColor(GREY)
        canvas.drawString(MARGIN, 9 * mm, f"Privacy audit report{' - generated ' + generated if generated else ''}")
        canvas.drawRightString(PAGE_W - MARGIN, 9 * mm, f"page {doc.page}")
        canvas.restoreState()

    story = _title(export) + _summary(datasets)
    for ds in datasets:
        story.append(PageBreak())
        story += _dataset_section(ds, accountants)
    story.append(PageBreak())
    story += _accounting(export)
    story.append(CondPageBreak(70 * mm))
    story += _how_to_verify(export)

    buf = io.BytesIO()
    doc = SimpleDocTemplate(
        buf, pagesize=A4, leftMargin=MARGIN, rightMargin=MARGIN, topMargin=MARGIN, bottomMargin=MARGIN + 3 * mm,
        title="Privacy audit report", author=_plain(export.get("generated_by") or ""),
        subject=f"Audit export {_plain(export.get('format') or '')}".strip(), creator="governance.audit.pdf",
        **({} if compress else {"pageCompression": 0, "invariant": 1}))
    doc.build(story, onFirstPage=footer, onLaterPages=footer)
    return buf.getvalue()
