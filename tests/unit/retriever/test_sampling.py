import math
from collections import Counter

import numpy as np
import pytest

from services.modeling.plackett_luce import gumbel_top_k, plackett_luce_logprob, query_rng


def test_plackett_luce_by_hand():
    logits = np.log(np.array([1.0, 2.0, 3.0, 4.0]))  # weights 1..4, total 10
    # P(3 then 1) = 4/10 * 2/6
    assert plackett_luce_logprob(logits, [3, 1]) == pytest.approx(math.log(4 / 10 * 2 / 6))
    # A full ordering's probabilities sum to one over all orders of two of three items.
    three = np.log(np.array([1.0, 1.0, 2.0]))
    total = sum(math.exp(plackett_luce_logprob(three, [a, b])) for a in range(3) for b in range(3) if a != b)
    assert total == pytest.approx(1.0)


def test_gumbel_top_k_samples_plackett_luce():
    logits = np.log(np.array([1.0, 2.0, 3.0, 4.0]))
    rng = np.random.default_rng(0)
    draws = Counter(tuple(gumbel_top_k(logits, 2, rng)) for _ in range(20_000))
    for pair, count in draws.items():
        expected = math.exp(plackett_luce_logprob(logits, list(pair)))
        assert count / 20_000 == pytest.approx(expected, abs=0.015)


def test_query_rng_is_per_seed_and_position():
    a = query_rng(5, 0).gumbel(size=3)
    assert np.array_equal(a, query_rng(5, 0).gumbel(size=3))
    assert not np.array_equal(a, query_rng(5, 1).gumbel(size=3))
