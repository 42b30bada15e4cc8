"""Issue 29's statistics with the seed as the unit, each against a number worked out by hand."""

from __future__ import annotations

import math

import pytest

from services.eval.stats import (
    benjamini_hochberg,
    bootstrap_questions,
    one_sample_t_test,
    seed_differences,
    seed_sign_test,
    student_t_two_sided_p,
)


def test_seed_differences_pair_seeds_and_questions():
    arm = {0: {"a": 1.0, "b": 0.0}, 1: {"a": 1.0, "b": 1.0}, 3: {"a": 1.0}}
    base = {0: {"a": 0.0, "b": 0.0}, 1: {"a": 1.0, "b": 0.0, "c": 1.0}, 2: {"a": 0.0}}
    # seed 0: (1 + 0) / 2; seed 1: only a and b are shared: (0 + 1) / 2; seeds 2 and 3 have one side only
    assert seed_differences(arm, base) == {0: 0.5, 1: 0.5}


def test_t_distribution_closed_forms():
    # df 1 is Cauchy: P(|T| >= t) = 1 - 2 atan(t) / pi; df 2: 1 - t / sqrt(2 + t^2)
    assert student_t_two_sided_p(2.0, 1) == pytest.approx(1 - 2 * math.atan(2.0) / math.pi, abs=1e-10)
    assert student_t_two_sided_p(1.0, 2) == pytest.approx(1 - 1 / math.sqrt(3), abs=1e-10)
    assert student_t_two_sided_p(0.0, 5) == pytest.approx(1.0)
    assert student_t_two_sided_p(2.776445, 4) == pytest.approx(0.05, abs=1e-5)  # the table's t_0.975,4


def test_one_sample_t_test_by_hand():
    result = one_sample_t_test([1.0, 3.0])  # mean 2, sd sqrt(2), se 1, t 2, df 1
    assert (result.mean, result.df) == (2.0, 1)
    assert result.sd == pytest.approx(math.sqrt(2)) and result.t == pytest.approx(2.0)
    assert result.p == pytest.approx(1 - 2 * math.atan(2.0) / math.pi, abs=1e-9)
    half = math.tan(math.pi * 0.475)  # t_0.975 with one degree of freedom, 12.706
    assert (result.low, result.high) == (pytest.approx(2 - half, abs=1e-6), pytest.approx(2 + half, abs=1e-6))
    flat = one_sample_t_test([0.25, 0.25, 0.25])  # no spread: t infinite
    assert flat.p == 0.0 and flat.t == math.inf
    assert one_sample_t_test([0.0, 0.0]).p == 1.0
    with pytest.raises(ValueError):
        one_sample_t_test([1.0])


def test_seed_sign_test_is_exact():
    four_up = seed_sign_test([0.1, 0.2, 0.3, 0.4])
    assert (four_up.better, four_up.worse, four_up.p) == (4, 0, pytest.approx(2 / 16))
    mixed = seed_sign_test([0.1, -0.2, 0.0, 0.4])
    assert (mixed.better, mixed.worse, mixed.ties) == (2, 1, 1) and mixed.p == pytest.approx(1.0)


def test_bootstrap_resamples_questions_whole():
    # Each question's values are averaged first: two questions of mean 0.5 leave nothing to resample.
    same = bootstrap_questions([[1.0, 0.0], [0.0, 1.0]], n=200)
    assert (same.value, same.low, same.high) == (0.5, 0.5, 0.5)
    # One all-right and one all-wrong question: a mean of 0.5 and resamples of 0, 0.5 or 1.
    split = bootstrap_questions([[1.0] * 8, [0.0] * 8], n=2000)
    assert split.value == 0.5 and split.low == 0.0 and split.high == 1.0
    with pytest.raises(ValueError):
        bootstrap_questions([[]])


def test_benjamini_hochberg_by_hand():
    # sorted p: 0.01, 0.03, 0.04, 0.20 (m = 4) -> p m / rank: 0.04, 0.06, 0.0533, 0.20 -> running min from the top
    adjusted = benjamini_hochberg([0.01, 0.04, 0.03, 0.20])
    assert adjusted == pytest.approx([0.04, 0.04 * 4 / 3, 0.04 * 4 / 3, 0.20])
    assert benjamini_hochberg([0.5, 0.9]) == pytest.approx([0.9, 0.9])
    assert benjamini_hochberg([]) == []
