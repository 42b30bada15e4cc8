"""Which served queries explore their retrieval, and how: the share, and the spec each kind gets."""

from __future__ import annotations

import random

from services.policy.settings import PolicySettings


def share_exploring(settings: PolicySettings, n: int = 20_000) -> float:
    rng = random.Random(0)
    return sum(settings.explores(rng.random()) for _ in range(n)) / n


def test_a_share_of_served_queries_explores_and_the_rest_retrieve_greedy():
    settings = PolicySettings(serve_retrieval="sample")  # the default share, 0.25
    assert abs(share_exploring(settings) - 0.25) < 0.01
    assert share_exploring(PolicySettings(serve_retrieval="sample", serve_retrieval_share=1)) == 1.0
    assert share_exploring(PolicySettings(serve_retrieval="sample", serve_retrieval_share=0)) == 0.0
    assert share_exploring(PolicySettings(serve_retrieval_share=1)) == 0.0  # greedy serving never explores
    explore, greedy = settings.serve_retrieval_spec(3, explore=True), settings.serve_retrieval_spec(3, explore=False)
    assert (explore.mode, explore.candidates, explore.temperature) == ("sample", 20, 0.05)
    assert (greedy.mode, greedy.candidates) == ("greedy", 3)
