"""The learning runs' statistics against values worked out by hand."""

from __future__ import annotations

import pytest

from services.eval.stats import bootstrap_mean_diff, sign_test


def test_sign_test_by_hand():
    # 9 better, 1 worse: p = 2 * (C(10,0) + C(10,1)) / 2^10 = 22 / 1024
    t = sign_test([0] * 9 + [1] + [1, 1], [1] * 9 + [0] + [1, 1])
    assert (t.better, t.worse, t.ties) == (9, 1, 2) and t.p == pytest.approx(22 / 1024)
    assert sign_test([0, 1], [1, 0]).p == 1.0  # one each way: no evidence
    assert sign_test([1, 1], [1, 1]).p == 1.0 and sign_test([1, 1], [1, 1]).ties == 2
    assert sign_test([0] * 6, [1] * 6).p == pytest.approx(2 / 64)
    with pytest.raises(ValueError, match="paired"):
        sign_test([0, 1], [1])


def test_bootstrap_interval_covers_the_difference_and_tells_noise_from_signal():
    before, after = [0.0, 1.0] * 20, [1.0] * 38 + [0.0] * 2  # 0.5 -> 0.95
    d = bootstrap_mean_diff(before, after, n=2000, seed=1)
    assert d.diff == pytest.approx(0.45) and d.low <= d.diff <= d.high and d.significant
    same = bootstrap_mean_diff([0.0, 1.0] * 5, [1.0, 0.0] * 5, n=2000, seed=1)
    assert same.diff == 0 and same.low < 0 < same.high and not same.significant
    assert bootstrap_mean_diff(before, after, n=500, seed=3) == bootstrap_mean_diff(before, after, n=500, seed=3)
