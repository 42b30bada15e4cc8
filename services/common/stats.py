"""The one percentile of latencies (and anything else) that reports, benches and experiments print."""

from __future__ import annotations

import math
from collections.abc import Iterable


def percentile(values: Iterable[float], q: float) -> float:
    """The q-quantile (0 <= q <= 1) by linear interpolation between the two closest ranks: numpy's default
    ("linear") and `statistics.quantiles(method="inclusive")`; q=0.5 is `statistics.median`. Needs a value."""
    if not 0.0 <= q <= 1.0:
        raise ValueError(f"q must be in [0, 1], not {q}")
    ordered = sorted(values)
    if not ordered:
        raise ValueError("percentile of no values")
    position = q * (len(ordered) - 1)
    below = math.floor(position)
    above = min(below + 1, len(ordered) - 1)
    return ordered[below] + (ordered[above] - ordered[below]) * (position - below)
