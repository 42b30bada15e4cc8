"""The one percentile (services/common/stats.py) that the eval report and the benches print."""

from __future__ import annotations

import random
import statistics

import numpy as np
import pytest

from services.common.stats import percentile


def test_by_hand():
    assert percentile([3.0], 0.99) == 3.0
    assert percentile([4.0, 1.0, 3.0, 2.0], 0.5) == 2.5  # unsorted input, the mean of the middle two
    assert percentile([1.0, 2.0, 3.0, 4.0, 5.0], 0.95) == pytest.approx(4.8)
    assert percentile([1.0, 2.0], 0.0) == 1.0 and percentile([1.0, 2.0], 1.0) == 2.0


def test_agrees_with_numpy_the_median_and_inclusive_quantiles():
    rng = random.Random(0)
    for n in (2, 3, 10, 101):
        values = [rng.expovariate(1.0) for _ in range(n)]
        assert percentile(values, 0.5) == pytest.approx(statistics.median(values))
        cuts = statistics.quantiles(values, n=100, method="inclusive")
        for q in (0.5, 0.95, 0.99):
            assert percentile(values, q) == pytest.approx(cuts[round(q * 100) - 1])
            assert percentile(values, q) == pytest.approx(float(np.percentile(values, 100 * q)))


@pytest.mark.parametrize(("values", "q"), [([], 0.5), ([1.0], 1.5), ([1.0], -0.1)])
def test_no_values_or_a_q_outside_zero_one_is_refused(values, q):
    with pytest.raises(ValueError):
        percentile(values, q)
