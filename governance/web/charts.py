"""Small server-rendered SVG charts for the officer's web UI (no JavaScript): a budget
gauge and a burn-down chart. Every number is formatted here; labels are escaped."""

from __future__ import annotations

import math
from html import escape

COLORS = {"basic": "#8c6d1f", "advanced": "#6a51a3", "rdp": "#1f6fb4"}


def _f(x: float) -> str:
    return f"{x:.1f}"


def gauge(spent: float, cap: float, *, width: int = 180, label: str = "", alarm: bool = True) -> str:
    """A bar of the share of ``cap`` spent, the numbers beside it. ``alarm``: colour it by
    how full it is (for the gating accountant; the others are drawn grey-blue)."""
    share = 1.0 if not math.isfinite(spent) else (min(1.0, spent / cap) if cap > 0 else 1.0)
    color = ("#c0392b" if share >= 0.9 else ("#e6a23c" if share >= 0.6 else "#2e8b57")) if alarm else "#7a8fa6"
    text = f"{spent:.3g} / {cap:g}" if math.isfinite(spent) else f"inf / {cap:g}"
    bar = width - 96
    return (f'<svg class="gauge" role="img" aria-label="{escape(label)} epsilon spent {escape(text)}" '
            f'width="{width}" height="20" viewBox="0 0 {width} 20">'
            f'<rect x="0" y="3" width="{bar}" height="14" rx="3" fill="#e8ecef"/>'
            f'<rect x="0" y="3" width="{_f(bar * share)}" height="14" rx="3" fill="{color}"/>'
            f'<text x="{bar + 6}" y="14" font-size="11" fill="currentColor">{escape(text)} ({share:.0%})</text></svg>')


def burndown(series: list[tuple[float, dict]], cap: float, *, width: int = 640, height: int = 240,
             accountants=("basic", "advanced", "rdp"), compact: bool = False) -> str:
    """Committed epsilon over time, one step line per accountant, the cap dashed.

    ``series``: [(unix time, {accountant: epsilon})], sorted by time. The y axis stops at
    1.3 x max(cap, rdp); a line above it is drawn at the top edge."""
    pad_l, pad_r, pad_t, pad_b = (2, 2, 2, 2) if compact else (44, 10, 10, 28)
    w, h = width - pad_l - pad_r, height - pad_t - pad_b
    if not series:
        height = min(height, 36)
        return (f'<svg class="burndown" width="{width}" height="{height}" role="img" aria-label="no releases yet">'
                f'<text x="{width / 2}" y="{height / 2 + 4}" text-anchor="middle" font-size="11" fill="#777">'
                'no releases yet</text></svg>')
    t0, t1 = series[0][0], series[-1][0]
    span = (t1 - t0) or 1.0
    top = max([cap] + [v.get("rdp", 0.0) for _, v in series if math.isfinite(v.get("rdp", 0.0))]) * 1.3 or 1.0

    def x(t):
        return pad_l + (t - t0) / span * w

    def y(v):
        v = top if not math.isfinite(v) else min(v, top)
        return pad_t + h - v / top * h

    parts = [(f'<svg class="burndown" width="{width}" height="{height}" viewBox="0 0 {width} {height}" '
              f'role="img" aria-label="epsilon spent over time, cap {cap:g}">'),
             f'<rect x="{pad_l}" y="{pad_t}" width="{w}" height="{h}" fill="#fafbfc" stroke="#d0d7de"/>']
    for name in accountants:
        pts, last = [], None
        for t, v in series:
            e = v.get(name)
            if e is None:
                continue
            if last is not None:
                pts.append(f"{_f(x(t))},{_f(y(last))}")
            pts.append(f"{_f(x(t))},{_f(y(e))}")
            last = e
        if pts:
            parts.append(f'<polyline fill="none" stroke="{COLORS.get(name, "#333")}" stroke-width="1.6" '
                         f'points="{" ".join(pts)}"><title>{escape(name)}</title></polyline>')
    parts.append(f'<line x1="{pad_l}" x2="{pad_l + w}" y1="{_f(y(cap))}" y2="{_f(y(cap))}" stroke="#c0392b" '
                 f'stroke-dasharray="5,4" stroke-width="1.4"><title>cap {cap:g}</title></line>')
    if not compact:
        for frac in (0, 0.5, 1):
            v = top * frac
            parts.append(f'<text x="{pad_l - 4}" y="{_f(y(v) + 4)}" text-anchor="end" font-size="10">{v:.2g}</text>')
        parts.append(f'<text x="{pad_l}" y="{height - 8}" font-size="10">{escape(_date(t0))}</text>')
        parts.append(f'<text x="{pad_l + w}" y="{height - 8}" text-anchor="end" font-size="10">'
                     f'{escape(_date(t1))}</text>')
        lx = pad_l + 8
        for name in accountants:
            parts.append(f'<text x="{lx}" y="{pad_t + 14}" font-size="10" fill="{COLORS.get(name, "#333")}">'
                         f'&#9632; {escape(name)}</text>')
            lx += 70
        parts.append(f'<text x="{lx}" y="{pad_t + 14}" font-size="10" fill="#c0392b">- - cap</text>')
    parts.append("</svg>")
    return "".join(parts)


def _date(t: float) -> str:
    from datetime import UTC, datetime

    return datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%d %H:%M")
