"""Whether a round can move the retriever (served traffic is mostly greedy), where its target answer comes
from, and the live run that is refused before it starts because its traffic could never train the retriever."""

from __future__ import annotations

import pytest

from services.common.schemas.policy import SearchStep, ServingConfig, TrajectoryRecord, TurnRecord
from services.trainer.algo.batch import build_batch, target_answer
from services.trainer.algo.config import AlgoConfig
from services.trainer.algo.round import retriever_unchanged_reason
from services.trainer.round_files import LiveTrafficRefused, check_live_traffic
from services.trainer.run_state import RunConfig

DOCS = {"d0": ("Paris", "Paris is the capital of France."), "d1": ("Rome", "Rome is the capital of Italy."),
        "d2": ("Lisbon", "Lisbon is the capital of Portugal.")}  # fmt: skip


def record(n: int, *, sampled: bool, golden: list[str] | None, answer: str = "Paris", reward: float = 1.0):
    """A served trajectory: one search over DOCS (greedy, or a sample with its log-prob), then an answer."""
    step = SearchStep(turn=0, query=f"capital question {n}", candidates=[{"id": d, "score": 0.5 - 0.1 * i}
                      for i, d in enumerate(DOCS)], chosen_ids=["d0"], mode="sample" if sampled else "greedy",
                      logprob=-0.4 if sampled else None, temperature=0.05, retriever_version="base")  # fmt: skip
    return TrajectoryRecord(
        id=f"t{n}", question=f"capital question {n}", golden_answers=golden, prompt="Q: ", prompt_ids=[1],
        turns=[TurnRecord(generated_ids=[2], generated_logprobs=[-1.0], text="<search> q </search>", search=step),
               TurnRecord(generated_ids=[3], generated_logprobs=[-1.0], text=f"<answer> {answer} </answer>")],
        answer=answer, policy_version="base", retriever_version="base", reward=reward, created_at=0.0,
    )  # fmt: skip


def batch(records, tokenizer, **cfg):
    return build_batch(records, AlgoConfig(q_candidates=2, **cfg), tokenizer, DOCS, baseline=0.0)


def test_greedy_traffic_leaves_the_retriever_unchanged(tokenizer):
    records = [record(n, sampled=False, golden=["Paris"]) for n in range(3)]
    assert retriever_unchanged_reason(batch(records, tokenizer), AlgoConfig()) == "no sampled searches"
    # The golden answers do not help: Q samples come from sampled searches only.
    assert retriever_unchanged_reason(batch(records, tokenizer), AlgoConfig(retriever_objective="target")) == (
        "no sampled searches"
    )
    assert retriever_unchanged_reason(batch(records, tokenizer), AlgoConfig(algo="search-r1")) is None


def test_one_sampled_search_is_a_signal_for_the_credit_not_for_a_target_without_answers(tokenizer):
    records = [record(0, sampled=True, golden=None), record(1, sampled=False, golden=None)]
    both = batch(records, tokenizer)
    assert both.q_samples == [] and retriever_unchanged_reason(both, AlgoConfig()) is None
    target = AlgoConfig(retriever_objective="target")
    assert retriever_unchanged_reason(batch(records, tokenizer, retriever_objective="target"), target) == (
        "no sampled searches with a target answer"
    )


def test_a_rewarded_answer_is_the_target_where_no_golden_answer_is(tokenizer):
    records = [record(0, sampled=True, golden=None, answer="Paris", reward=1.0),
               record(1, sampled=True, golden=None, answer="Lyon", reward=0.0),
               record(2, sampled=True, golden=["Rome"], answer="Lyon", reward=0.0)]  # fmt: skip
    assert [target_answer(r, "golden") for r in records] == [None, None, "Rome"]
    assert [target_answer(r, "rewarded") for r in records] == ["Paris", None, "Rome"]
    cfg = dict(retriever_objective="target", target_answer="rewarded")
    b = batch(records, tokenizer, **cfg)
    answers = sorted(tokenizer.decode(q.answer_ids).strip() for q in b.q_samples)
    assert answers == ["Paris </answer>", "Rome </answer>"]
    assert retriever_unchanged_reason(b, AlgoConfig(**cfg)) is None
    assert batch(records, tokenizer, retriever_objective="target").q_samples[0].search == 2  # golden only


def serving(retrieval: str = "sample", share: float = 0.25) -> ServingConfig:
    return ServingConfig(temperature=0.7, retrieval=retrieval, retrieval_share=share, retrieval_candidates=20,
                         retrieval_temperature=0.05)  # fmt: skip


@pytest.mark.parametrize(("retrieval", "share", "why"), [("greedy", 0.25, "greedy retrieval"),
                                                         ("sample", 0.0, "retrieval_share 0")])  # fmt: skip
def test_a_live_run_on_traffic_that_cannot_train_the_retriever_is_refused(retrieval, share, why):
    live = RunConfig(run_id="r", source="live")
    with pytest.raises(LiveTrafficRefused, match=why) as refused:
        check_live_traffic(live, serving(retrieval, share))
    assert "\n" not in str(refused.value) and "--algo search-r1" in str(refused.value)
    # The user asked for the policy alone, or the traffic explores, or the run trains on its own rollouts: it starts.
    check_live_traffic(live.model_copy(update={"algo": AlgoConfig(algo="search-r1")}), serving(retrieval, share))
    check_live_traffic(live, serving())
    check_live_traffic(RunConfig(run_id="r"), serving(retrieval, share))
