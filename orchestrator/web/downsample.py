"""Server-side downsampling, so a 100,000-step curve reaches the browser as a few thousand points.

Min/max buckets rather than plain striding or averaging: a loss spike or a throughput drop that
lasts one step stays visible at any zoom, which is what people look at these curves for.
"""

from __future__ import annotations

from collections.abc import Sequence


def minmax(xs: Sequence[float], ys: Sequence[float | None], max_points: int) -> tuple[list, list]:
    """At most `max_points` (x, y) pairs: each of max_points/2 buckets of consecutive points keeps
    its lowest and highest y, in x order. None values (no data) are dropped first."""
    px = [x for x, y in zip(xs, ys) if y is not None]
    py = [y for y in ys if y is not None]
    n = len(py)
    if n <= max_points:
        return px, [_round(y) for y in py]
    buckets = max(1, max_points // 2)
    size = n / buckets
    out_x: list = []
    out_y: list = []
    for b in range(buckets):
        lo_i, hi_i = int(b * size), int((b + 1) * size)
        chunk = py[lo_i:hi_i]
        if not chunk:
            continue
        i_min, i_max = chunk.index(min(chunk)), chunk.index(max(chunk))  # C speed, not a key lambda
        for i in sorted({i_min, i_max}):
            out_x.append(px[lo_i + i])
            out_y.append(_round(chunk[i]))
    return out_x, out_y


def _round(y: float) -> float:
    """Five significant digits: more than a chart can show, and a third of the bytes."""
    return float(f"{y:.5g}")
