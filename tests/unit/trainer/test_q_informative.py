"""Which searches a y*-scored teacher can rank (`AlgoConfig.q_informative_only`, docs/results.md section 23)."""

from __future__ import annotations

import torch

from services.common.schemas.policy import TrajectoryRecord
from services.trainer.algo.batch import SearchSample, informative
from services.trainer.algo.config import AlgoConfig

DOCS = {"d0": ("Paris", "The capital of France."), "d1": ("Lyon", "A city on the Rhone."),
        "d2": ("Nice", "Nice lies on the coast; Paris is far.")}  # fmt: skip


def record(golden: list[str]) -> TrajectoryRecord:
    return TrajectoryRecord(id="t", item_id="q", question="q?", golden_answers=golden, prompt="", prompt_ids=[],
                            turns=[], answer=None, policy_version="b", retriever_version="b", created_at=0)  # fmt: skip


def search(candidates: list[str], scores: list[float]) -> SearchSample:
    return SearchSample(0, "q?", candidates, torch.tensor(scores), torch.tensor([0]), 1.0, 0.0)


def test_only_candidates_that_differ_in_holding_y_star_and_no_label_answers_get_a_target():
    cfg = AlgoConfig(q_candidates=2)
    differ = search(["d0", "d1", "d2"], [0.9, 0.8, 0.1])  # top 2: d0 writes "Paris", d1 does not
    assert informative(record(["Paris"]), differ, cfg, DOCS)
    assert not informative(record(["Marseille"]), differ, cfg, DOCS)  # no candidate holds y*: noise
    both_hold = search(["d0", "d2", "d1"], [0.9, 0.8, 0.1])  # d1, the one that does not, is outside the top 2
    assert not informative(record(["Paris"]), both_hold, cfg, DOCS)
    assert informative(record(["Paris"]), both_hold, AlgoConfig(q_candidates=3), DOCS)
    assert not informative(record(["yes"]), differ, cfg, DOCS)  # a label: no passage writes it
    assert informative(record(["Lutetia", "paris"]), differ, cfg, DOCS)  # any alias, normalised
