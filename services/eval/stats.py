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


# The training seed as the unit. Each seed gives one paired difference (arm - search-r1 from the same
# start, averaged over the evaluation questions); the tests below run across seeds, the bootstrap within one.


def seed_differences(arm: dict[int, dict[str, float]], baseline: dict[int, dict[str, float]]) -> dict[int, float]:
    """Per seed, mean over the evaluation questions of metric(arm) - metric(baseline). `arm[seed][question]` is a
    question's metric in that seed's run; only seeds both sides ran count, and within a seed only the questions
    both sides scored (an evaluation that lost questions is a paired comparison of the rest)."""
    out: dict[int, float] = {}
    for seed in sorted(set(arm) & set(baseline)):
        shared = sorted(set(arm[seed]) & set(baseline[seed]))
        if shared:
            out[seed] = sum(arm[seed][q] - baseline[seed][q] for q in shared) / len(shared)
    return out


def _betacf(a: float, b: float, x: float) -> float:
    """Continued fraction of the incomplete beta function (modified Lentz; Numerical Recipes 6.4)."""
    tiny, qab, qap, qam = 1e-300, a + b, a + 1.0, a - 1.0
    c, d = 1.0, 1.0 - qab * x / qap
    d = 1.0 / (d if abs(d) > tiny else tiny)
    h = d
    for m in range(1, 300):
        m2 = 2 * m
        for aa in (m * (b - m) * x / ((qam + m2) * (a + m2)), -(a + m) * (qab + m) * x / ((a + m2) * (qap + m2))):
            d = 1.0 + aa * d
            d = 1.0 / (d if abs(d) > tiny else tiny)
            c = 1.0 + aa / c
            c = c if abs(c) > tiny else tiny
            h *= d * c
        if abs(d * c - 1.0) < 1e-15:
            break
    return h


def regularized_beta(x: float, a: float, b: float) -> float:
    """I_x(a, b), the regularized incomplete beta function, for 0 <= x <= 1."""
    if x <= 0.0:
        return 0.0
    if x >= 1.0:
        return 1.0
    front = math.exp(math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x))
    if x < (a + 1.0) / (a + b + 2.0):
        return front * _betacf(a, b, x) / a
    return 1.0 - front * _betacf(b, a, 1.0 - x) / b


def student_t_two_sided_p(t: float, df: float) -> float:
    """P(|T| >= |t|) for Student's t with `df` degrees of freedom: I_{df / (df + t^2)}(df / 2, 1 / 2)."""
    return regularized_beta(df / (df + t * t), df / 2.0, 0.5)


def welch_lower_p(a: tuple[int, float, float], b: tuple[int, float, float]) -> float:
    """One-sided Welch test of H1: mean(b) < mean(a), from each sample's (n, mean, variance with n - 1). With zero
    spread in both, p is 0 when b's mean is lower and 1 otherwise (the statistic is infinite or undefined)."""
    (na, ma, va), (nb, mb, vb) = a, b
    if na < 2 or nb < 2:
        return 1.0
    se2 = va / na + vb / nb
    if se2 == 0:
        return 0.0 if mb < ma else 1.0
    t = (mb - ma) / math.sqrt(se2)
    df = se2**2 / ((va / na) ** 2 / (na - 1) + (vb / nb) ** 2 / (nb - 1))
    half = student_t_two_sided_p(t, df) / 2
    return half if t < 0 else 1.0 - half


class TTest(BaseModel):
    """One-sample t-test of mean(values) = 0 (two-sided), with the t interval of the mean."""

    n: int
    mean: float
    sd: float
    t: float
    df: int
    p: float
    low: float
    high: float
    level: float

    def __str__(self) -> str:
        return f"{self.mean:+.3f} [{self.low:+.3f}, {self.high:+.3f}], t({self.df}) = {self.t:.2f}, p = {self.p:.3g}"


def _t_quantile(q: float, df: int) -> float:
    """The t distribution's upper quantile by bisection on the two-sided p (enough for an interval's ends)."""
    lo, hi = 0.0, 1e3
    for _ in range(200):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if student_t_two_sided_p(mid, df) > 2 * (1 - q) else (lo, mid)
    return (lo + hi) / 2


def one_sample_t_test(values: Sequence[float], level: float = 0.95) -> TTest:
    """H0: the mean of `values` (one paired difference per seed) is 0. Needs two values at least; with zero
    spread the p is 1 for a zero mean and 0 otherwise (the t statistic is infinite)."""
    n = len(values)
    if n < 2:
        raise ValueError(f"a t-test needs two values at least, got {n}")
    mean = sum(values) / n
    sd = math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1))
    se = sd / math.sqrt(n)
    df = n - 1
    if se == 0:
        t = 0.0 if mean == 0 else math.copysign(math.inf, mean)
        p = 1.0 if mean == 0 else 0.0
    else:
        t = mean / se
        p = student_t_two_sided_p(t, df)
    half = _t_quantile(1 - (1 - level) / 2, df) * se
    return TTest(n=n, mean=mean, sd=sd, t=t, df=df, p=p, low=mean - half, high=mean + half, level=level)


def seed_sign_test(differences: Sequence[float]) -> SignTest:
    """The exact sign test across seeds: how many seeds' differences are above / below 0 (zeros are ties)."""
    return sign_test([0.0] * len(differences), list(differences))


class Interval(BaseModel):
    """A statistic with a percentile bootstrap interval."""

    value: float
    low: float
    high: float
    level: float

    def __str__(self) -> str:
        return f"{self.value:+.3f} [{self.low:+.3f}, {self.high:+.3f}]"


def bootstrap_questions(
    groups: Sequence[Sequence[float]], n: int = 10_000, level: float = 0.95, seed: int = 0
) -> Interval:
    """Mean over questions of each question's mean, with an interval that resamples QUESTIONS: each resample
    draws len(groups) questions with replacement and keeps every value of a drawn question together (a question's
    K sampled answers, or its one paired difference), so the interval is over questions, not over answers that
    share a question."""
    means = [sum(g) / len(g) for g in groups if g]
    if not means:
        raise ValueError("no question has a value")
    rng = random.Random(seed)
    stats = sorted(sum(rng.choices(means, k=len(means))) / len(means) for _ in range(n))
    tail = (1 - level) / 2
    return Interval(value=sum(means) / len(means), low=stats[int(tail * (n - 1))],
                    high=stats[int((1 - tail) * (n - 1))], level=level)  # fmt: skip


def benjamini_hochberg(pvalues: Sequence[float]) -> list[float]:
    """Benjamini–Hochberg adjusted p-values (q-values), in the input's order: q_(i) = min over j >= i of
    p_(j) m / j, capped at 1. Reject the hypotheses whose q is at most the false discovery rate."""
    m = len(pvalues)
    order = sorted(range(m), key=lambda i: pvalues[i])
    adjusted = [0.0] * m
    running = 1.0
    for rank in range(m, 0, -1):
        i = order[rank - 1]
        running = min(running, pvalues[i] * m / rank)
        adjusted[i] = min(1.0, running)
    return adjusted
