"""The PDF audit report's building blocks: its styles and limits, text made safe for the
built-in fonts, number and time formats, tables, and the charts drawn with matplotlib's
object API on the Agg canvas (``governance.audit.pdf`` puts the report together).

Everything that comes from users is escaped here (``_t``, ``_mono``, ``_mpl``) before it
goes into a Paragraph or a chart, and reduced to the characters the built-in fonts have
(cp1252).
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
from reportlab.platypus import Image, Paragraph, Table, TableStyle

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


TEXT_LIMIT = 2000  # characters of one text: a cell of 100,000 was taller than a page (reportlab's LayoutError)


def _plain(value, limit: int = TEXT_LIMIT) -> str:
    """``value`` as text the built-in fonts can draw (not escaped: for canvas/table strings),
    cut to ``limit`` characters."""
    text = "" if value is None else str(value)
    text = _CONTROL.sub(" ", text.translate(_SPELL))
    text = text.encode("cp1252", "replace").decode("cp1252")
    if len(text) > limit:
        text = text[: limit - 3] + "..."
    return text


def _t(value, limit: int = TEXT_LIMIT) -> str:
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


def _burndown(ds: dict, points: list[dict], n: int, accountants: list[str]) -> list:
    """The chart of the running totals of ``points`` (each {"at", "totals"}: the records
    ``_sample(n)`` picks of the dataset's ``n``)."""
    budget = ds.get("budget") or {}
    policy = budget.get("policy") or ""
    cap = _num(budget.get("epsilon"))
    times, series = [], {a: [] for a in accountants}
    for rec in points:
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

    caption = (f"Budget burn-down: committed epsilon after each record under each accountant, at the dataset's "
               f"delta ({_fmt((points[-1].get('totals') or {}).get('at_delta'))}); {n} record{'s' * (n != 1)}")
    caption += (f"; one record in {-(-n // (MAX_POINTS - 1))} plotted, first and last kept." if len(points) < n
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
