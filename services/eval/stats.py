"""Honest statistics for small learning runs: a bootstrap interval of a difference of means, and the exact paired
sign test. Pure Python (no SciPy), seeded, so a report is reproducible."""

from __future__ import annotations

import math
import random
from collections.abc import Sequence

from pydantic import BaseModel


class MeanDiff(BaseModel):
    """mean(after) - mean(before), with a percentile bootstrap interval (each side resampled on its own)."""

    before: float
    after: float
    diff: float
    low: float
    high: float
    level: float

    @property
    def significant(self) -> bool:
        return self.low > 0 or self.high < 0

    def __str__(self) -> str:
        return f"{self.diff:+.3f} [{self.low:+.3f}, {self.high:+.3f}]"


def bootstrap_mean_diff(
    before: Sequence[float], after: Sequence[float], n: int = 10_000, level: float = 0.95, seed: int = 0
) -> MeanDiff:
    if not before or not after:
        raise ValueError("both samples need at least one value")
    rng = random.Random(seed)
    diffs = sorted(
        sum(rng.choices(after, k=len(after))) / len(after) - sum(rng.choices(before, k=len(before))) / len(before)
        for _ in range(n)
    )
    tail = (1 - level) / 2
    mean_before, mean_after = sum(before) / len(before), sum(after) / len(after)
    return MeanDiff(
        before=mean_before,
        after=mean_after,
        diff=mean_after - mean_before,
        low=diffs[int(tail * (n - 1))],
        high=diffs[int((1 - tail) * (n - 1))],
        level=level,
    )


class SignTest(BaseModel):
    """Paired outcomes: how many items got better, worse, or stayed; two-sided exact binomial p (ties dropped)."""

    better: int
    worse: int
    ties: int
    p: float

    def __str__(self) -> str:
        return f"+{self.better}/-{self.worse} (={self.ties}), p={self.p:.3g}"


def sign_test(before: Sequence[float], after: Sequence[float]) -> SignTest:
    if len(before) != len(after):
        raise ValueError(f"paired samples differ in length: {len(before)} vs {len(after)}")
    better = sum(a > b for b, a in zip(before, after, strict=True))
    worse = sum(a < b for b, a in zip(before, after, strict=True))
    ties = len(before) - better - worse
    m = better + worse
    if m == 0:
        return SignTest(better=0, worse=0, ties=ties, p=1.0)
    k = min(better, worse)
    p = min(1.0, 2 * sum(math.comb(m, i) for i in range(k + 1)) / 2**m)
    return SignTest(better=better, worse=worse, ties=ties, p=p)
