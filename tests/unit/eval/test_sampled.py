"""Sampled evaluation: per-question aggregation of greedy and sampled answers, and request chunking."""

from __future__ import annotations

import pytest

from services.data.datasets import EvalItem
from services.eval.logprob import AnswerLogprob
from services.eval.sampled import SampleResult, chunks, per_question, summarize_questions
from services.eval.scoring import ItemResult


def _greedy(dataset: str, qid: str, em: float, mode: str = "agent") -> ItemResult:
    return ItemResult(dataset=dataset, mode=mode, id=qid, question="?", golden_answers=["a"], answer="a",
                      em=em, f1=em, recall=None, retrieved_ids=[], searches=1, latency_s=0.1)  # fmt: skip


def _sample(dataset: str, qid: str, k: int, em: float) -> SampleResult:
    return SampleResult(dataset=dataset, id=qid, sample=k, answer="x", em=em, f1=em / 2)


def test_per_question_means_samples_next_to_greedy():
    greedy = [_greedy("hotpotqa", "q1", 1.0), _greedy("hotpotqa", "q2", 0.0), _greedy("nq", "q1", 0.0)]
    samples = [_sample("hotpotqa", "q1", k, em) for k, em in enumerate([1, 1, 0, 0])]
    samples += [_sample("hotpotqa", "q2", k, em) for k, em in enumerate([0, 0, 0, 1])]
    samples += [_sample("nq", "q9", 0, 1.0)]  # sampled, never answered greedily
    logprobs = [AnswerLogprob(dataset="hotpotqa", id="q1", logprob=-6.0, tokens=3)]
    rows = {(r.dataset, r.id): r for r in per_question(greedy, samples, logprobs)}
    q1 = rows[("hotpotqa", "q1")]
    assert (q1.em_greedy, q1.em_sampled, q1.f1_sampled, q1.samples) == (1.0, 0.5, 0.25, 4)
    assert (q1.logprob, q1.logprob_per_token) == (-6.0, -2.0)
    assert rows[("hotpotqa", "q2")].em_sampled == 0.25 and rows[("hotpotqa", "q2")].logprob is None
    assert rows[("nq", "q1")].em_sampled is None and rows[("nq", "q1")].samples == 0  # same id, other dataset
    assert rows[("nq", "q9")].em_greedy is None and rows[("nq", "q9")].em_sampled == 1.0
    means = summarize_questions(list(rows.values()))
    assert means["hotpotqa"]["n"] == 2 and means["hotpotqa"]["em_sampled"] == pytest.approx(0.375)
    assert means["all"]["em_greedy"] == pytest.approx(1 / 3)  # over the 3 questions that have a greedy answer
    assert means["all"]["em_sampled"] == pytest.approx((0.5 + 0.25 + 1.0) / 3)
    assert means["all"]["logprob"] == -6.0


def test_chunks_bound_trajectories_and_never_mix_datasets():
    items = [EvalItem(id=str(i), dataset=d, question="?", golden_answers=["a"]) for d in ("a", "b") for i in range(5)]
    parts = chunks(items, samples=8, max_trajectories=16)  # 2 questions x 8 samples a request
    assert [len(p) for p in parts] == [2, 2, 1, 2, 2, 1]
    assert all(len({i.dataset for i in p}) == 1 for p in parts)
    assert [i for p in parts for i in p] == items
