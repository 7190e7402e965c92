"""Small inline SVG charts for the report (no JavaScript library, nothing fetched)."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from html import escape

__all__ = ["bar_chart", "histogram", "line_chart", "stacked_bars"]

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


def line_chart(
    title: str,
    series: Mapping[str, Sequence[tuple[float, float]]],
    *,
    low_high: Mapping[str, Sequence[tuple[float, float, float]]] | None = None,
    y_range: tuple[float, float] | None = None,
    width: int = 520,
) -> str:
    """Lines of ``(x, y)`` points per series (one colour class each, ``s0``, ``s1``, ...), a dot
    per point; ``low_high[name]`` adds ``(x, low, high)`` whiskers (confidence intervals)."""
    points = [p for pts in series.values() for p in pts]
    whiskers = [w for ws in (low_high or {}).values() for w in ws]
    xs = [x for x, _ in points] or [0.0, 1.0]
    ys = [y for _, y in points if math.isfinite(y)] + [
        v for _, lo, hi in whiskers for v in (lo, hi)
    ]
    x0, x1 = min(xs), max(xs) if max(xs) > min(xs) else min(xs) + 1
    y0, y1 = y_range or (min(ys, default=0.0), max(ys, default=1.0))
    y1 = y1 if y1 > y0 else y0 + 1
    h, pad = 180, 28

    def sx(x: float) -> float:
        return pad + (width - 2 * pad) * (x - x0) / (x1 - x0)

    def sy(y: float) -> float:
        return h - pad - (h - 2 * pad) * (y - y0) / (y1 - y0)

    parts = [
        f'<svg class="line" viewBox="0 0 {width} {h + 24}" role="img" '
        f'aria-label="{escape(title)}"><title>{escape(title)}</title>',
        f'<line x1="{pad}" y1="{h - pad}" x2="{width - pad}" y2="{h - pad}" class="axis"/>',
        f'<line x1="{pad}" y1="{pad}" x2="{pad}" y2="{h - pad}" class="axis"/>',
        f'<text x="{pad - 4}" y="{sy(y1) + 4:.1f}" text-anchor="end" class="lbl">{_fmt(y1)}</text>',
        f'<text x="{pad - 4}" y="{sy(y0) + 4:.1f}" text-anchor="end" class="lbl">{_fmt(y0)}</text>',
        f'<text x="{sx(x1):.1f}" y="{h - 10}" text-anchor="middle" class="lbl">{_fmt(x1)}</text>',
        f'<text x="{sx(x0):.1f}" y="{h - 10}" text-anchor="middle" class="lbl">{_fmt(x0)}</text>',
    ]
    for i, (name, pts) in enumerate(series.items()):
        good = [(x, y) for x, y in pts if math.isfinite(y)]
        path = " ".join(f"{sx(x):.1f},{sy(y):.1f}" for x, y in good)
        parts.append(f'<polyline class="s{i}" fill="none" points="{path}"/>')
        for x, y in good:
            parts.append(
                f'<circle class="s{i}" cx="{sx(x):.1f}" cy="{sy(y):.1f}" r="2.5">'
                f"<title>{escape(name)} at {_fmt(x)}: {y:.3f}</title></circle>"
            )
        for x, lo, hi in (low_high or {}).get(name, ()):
            parts.append(
                f'<line class="s{i} ci" x1="{sx(x):.1f}" y1="{sy(lo):.1f}" x2="{sx(x):.1f}" '
                f'y2="{sy(hi):.1f}"/>'
            )
        parts.append(
            f'<text x="{pad + 6 + 150 * i}" y="{h + 16}" class="s{i} key">{escape(name)}</text>'
        )
    parts.append(
        f'<text x="{width / 2}" y="{pad - 10}" text-anchor="middle" class="ttl">{escape(title)}</text>'
    )
    parts.append("</svg>")
    return "".join(parts)


def stacked_bars(
    title: str,
    steps: Sequence[float],
    parts_by_name: Mapping[str, Sequence[float]],
    *,
    width: int = 520,
) -> str:
    """One bar per step, stacked by part (e.g. seconds of rollout, train and sync)."""
    n = max(1, len(steps))
    totals = [sum(vals[i] for vals in parts_by_name.values()) for i in range(len(steps))]
    top = max(totals, default=0.0) or 1.0
    h, pad = 180, 28
    bw = (width - 2 * pad) / n
    out = [
        f'<svg class="line" viewBox="0 0 {width} {h + 24}" role="img" '
        f'aria-label="{escape(title)}"><title>{escape(title)}</title>'
    ]
    for i, step in enumerate(steps):
        y = float(h - pad)
        for k, (name, vals) in enumerate(parts_by_name.items()):
            bh = (h - 2 * pad) * vals[i] / top
            y -= bh
            out.append(
                f'<rect class="s{k}" x="{pad + i * bw + 1:.1f}" y="{y:.1f}" '
                f'width="{max(bw - 2, 1):.1f}" height="{bh:.1f}"><title>step {_fmt(step)} '
                f"{escape(name)}: {vals[i]:.2f}</title></rect>"
            )
    for k, name in enumerate(parts_by_name):
        out.append(
            f'<text x="{pad + 6 + 110 * k}" y="{h + 16}" class="s{k} key">{escape(name)}</text>'
        )
    out.append(
        f'<text x="{pad - 4}" y="{pad + 4}" text-anchor="end" class="lbl">{_fmt(top)}</text>'
        f'<text x="{width / 2}" y="{pad - 10}" text-anchor="middle" class="ttl">{escape(title)}</text>'
        "</svg>"
    )
    return "".join(out)


def _fmt(v: float) -> str:
    if float(v).is_integer():
        return str(int(v))
    return f"{v:.2g}" if abs(v) < 10 else f"{v:.0f}"


def _short(label: str) -> str:
    return label if len(label) <= 10 else label[:9] + "…"
