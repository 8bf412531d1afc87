"""Server-side SVG charts for the dashboard (no JavaScript, no external assets)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from html import escape
from typing import Protocol


class Bucket(Protocol):
    """One bucket of a rate chart (``Control.throughput``'s ``ThroughputBucket`` is one).

    Attributes:
        start: bucket start, epoch seconds (ledger clock).
        arrivals, completions: tasks submitted / finished in the bucket.
    """

    @property
    def start(self) -> float: ...

    @property
    def arrivals(self) -> int: ...

    @property
    def completions(self) -> int: ...


@dataclass(frozen=True, slots=True)
class RatePoint:
    """A :class:`Bucket` as a plain record (tests, and callers that count themselves)."""

    start: float
    arrivals: int
    completions: int


def _nice_ceiling(value: float) -> float:
    """The smallest of 1, 2, 2.5, 5 x 10^k that is >= ``value`` (``value`` > 0)."""
    exp = math.floor(math.log10(value))
    for step in (1.0, 2.0, 2.5, 5.0, 10.0):
        top = step * 10.0 ** exp
        if top >= value * (1 - 1e-9):
            return top
    return 10.0 ** (exp + 1)


def _rate_label(per_s: float) -> str:
    if per_s == 0:
        return "0"
    if per_s >= 100:
        return f"{per_s:.0f}/s"
    if per_s >= 1:
        return f"{per_s:.3g}/s"
    return f"{per_s * 60:.3g}/min"


def arrival_completion_svg(points: Sequence[Bucket], bucket_s: float, *,
                           title: str = "arrivals vs completions",
                           width: int = 640, height: int = 180) -> str:
    """An inline SVG line chart of arrival and completion rates (tasks per second) per
    bucket, oldest bucket on the left.

    Args:
        points: the buckets, oldest first (may be empty: the chart says "no data").
        bucket_s: bucket length, seconds (> 0): a bucket's rate is its count / bucket_s.
        title: the chart's accessible title.
        width: the SVG's width in pixels.
        height: the SVG's height in pixels.

    Returns:
        The ``<svg>`` element as text (every label escaped; safe to insert as markup).

    Raises:
        ValueError: ``bucket_s`` is not > 0.
    """
    if not bucket_s > 0:
        raise ValueError(f"bucket_s must be > 0, got {bucket_s!r}")
    left, right, top, bottom = 56, 12, 12, 26
    plot_w, plot_h = width - left - right, height - top - bottom
    parts = [
        f'<svg class="chart" xmlns="http://www.w3.org/2000/svg" width="{width}" '
        f'height="{height}" viewBox="0 0 {width} {height}" role="img" '
        f'aria-label="{escape(title)}"><title>{escape(title)}</title>',
        f'<rect x="{left}" y="{top}" width="{plot_w}" height="{plot_h}" class="plot"/>',
    ]
    if not points:
        parts.append(f'<text x="{left + plot_w / 2}" y="{top + plot_h / 2}" '
                     'text-anchor="middle" class="empty">no data</text></svg>')
        return "".join(parts)
    peak = max(max(p.arrivals, p.completions) for p in points) / bucket_s
    y_max = _nice_ceiling(peak) if peak > 0 else 1.0
    n = len(points)

    def x(i: int) -> float:
        return left + (plot_w * (i + 0.5) / n)

    def y(count: int) -> float:
        return top + plot_h - plot_h * (count / bucket_s) / y_max

    for frac in (0.0, 0.5, 1.0):
        gy = top + plot_h - plot_h * frac
        parts.append(f'<line x1="{left}" x2="{left + plot_w}" y1="{gy:.1f}" y2="{gy:.1f}" '
                     'class="grid"/>')
        parts.append(f'<text x="{left - 4}" y="{gy + 4:.1f}" text-anchor="end" '
                     f'class="axis">{escape(_rate_label(y_max * frac))}</text>')
    span_s = n * bucket_s
    parts.append(f'<text x="{left}" y="{height - 8}" class="axis">'
                 f'-{escape(_span_label(span_s))}</text>')
    parts.append(f'<text x="{left + plot_w}" y="{height - 8}" text-anchor="end" '
                 'class="axis">now</text>')
    for series, attr in (("arrivals", "arrivals"), ("completions", "completions")):
        coords = " ".join(f"{x(i):.1f},{y(getattr(p, attr)):.1f}"
                          for i, p in enumerate(points))
        parts.append(f'<polyline points="{coords}" class="line {series}" fill="none"/>')
        for i, p in enumerate(points):
            count = getattr(p, attr)
            parts.append(f'<circle cx="{x(i):.1f}" cy="{y(count):.1f}" r="2" '
                         f'class="dot {series}"><title>{series}: {count} in '
                         f'{bucket_s:g} s</title></circle>')
    parts.append("</svg>")
    return "".join(parts)


def _span_label(seconds: float) -> str:
    if seconds >= 3600:
        return f"{seconds / 3600:g} h"
    if seconds >= 60:
        return f"{seconds / 60:g} min"
    return f"{seconds:g} s"
