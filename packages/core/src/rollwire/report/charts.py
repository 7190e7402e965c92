"""Small inline SVG charts for the report (no JavaScript library, nothing fetched)."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from html import escape

__all__ = ["bar_chart", "histogram"]

_W, _H, _PAD = 260, 120, 18


def bar_chart(
    title: str,
    values: Mapping[str, float] | Sequence[tuple[str, float]],
    *,
    css_class: str = "chart",
) -> str:
    """Labelled vertical bars, one per key (an empty mapping draws an empty frame)."""
    items = list(values.items()) if isinstance(values, Mapping) else list(values)
    top = max((v for _, v in items), default=0.0) or 1.0
    n = max(1, len(items))
    bw = (_W - 2 * _PAD) / n
    parts = [
        f'<svg class="{css_class}" viewBox="0 0 {_W} {_H + 30}" role="img" '
        f'aria-label="{escape(title)}"><title>{escape(title)}</title>'
    ]
    for i, (label, v) in enumerate(items):
        h = (_H - 2 * _PAD) * (v / top)
        x = _PAD + i * bw
        y = _H - _PAD - h
        parts.append(
            f'<rect x="{x + 2:.1f}" y="{y:.1f}" width="{max(bw - 4, 1):.1f}" height="{h:.1f}">'
            f"<title>{escape(label)}: {_fmt(v)}</title></rect>"
        )
        parts.append(
            f'<text x="{x + bw / 2:.1f}" y="{y - 3:.1f}" text-anchor="middle">{_fmt(v)}</text>'
        )
        parts.append(
            f'<text x="{x + bw / 2:.1f}" y="{_H - 4}" text-anchor="middle" class="lbl">'
            f"{escape(_short(label))}</text>"
        )
    parts.append(
        f'<line x1="{_PAD}" y1="{_H - _PAD}" x2="{_W - _PAD}" y2="{_H - _PAD}" class="axis"/>'
    )
    parts.append(
        f'<text x="{_W / 2}" y="{_H + 22}" text-anchor="middle" class="ttl">{escape(title)}</text>'
    )
    parts.append("</svg>")
    return "".join(parts)


def histogram(title: str, values: Sequence[float], *, bins: int = 10) -> str:
    """A histogram of ``values`` (integers get one bin each when there are few distinct ones)."""
    finite = [float(v) for v in values if math.isfinite(v)]
    if not finite:
        return bar_chart(title, {})
    bins = max(1, min(bins, math.ceil(math.sqrt(len(finite)))))
    lo, hi = min(finite), max(finite)
    distinct = sorted(set(finite))
    if len(distinct) <= bins and all(v.is_integer() for v in distinct):
        counts = {_fmt(v): float(finite.count(v)) for v in distinct}
        return bar_chart(title, counts)
    if hi == lo:
        return bar_chart(title, {_fmt(lo): float(len(finite))})
    width = (hi - lo) / bins
    counts_list = [0] * bins
    for v in finite:
        counts_list[min(int((v - lo) / width), bins - 1)] += 1
    labels = [_fmt(lo + (i + 0.5) * width) for i in range(bins)]
    return bar_chart(title, list(zip(labels, map(float, counts_list))))


def _fmt(v: float) -> str:
    if float(v).is_integer():
        return str(int(v))
    return f"{v:.2g}" if abs(v) < 10 else f"{v:.0f}"


def _short(label: str) -> str:
    return label if len(label) <= 10 else label[:9] + "…"
