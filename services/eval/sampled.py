"""K sampled answers per question: a less noisy evaluation than one greedy answer.

Greedy EM@1 is a 0/1 per question, so two checkpoints that differ a little share most of their answers and a run's
score moves by whole questions. Sampling K answers per question at the rollout temperature and averaging their EM
estimates the probability that the policy answers right, a number in [0, 1] per question that moves with the
policy. The samples come from the policy service's `POST /v1/rollouts` (the training rollouts' own path: sampled
decoding, and sampled retrieval at the given retrieval temperature), seeded, so a rerun draws the same samples;
each answer is scored here as greedy evaluation scores it (`answer_scores`), not by the service's reward.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

from pydantic import BaseModel
from tqdm import tqdm

from services.common.schemas.retriever import DEFAULT_TOP_K
from services.data.datasets import EvalItem
from services.eval.scoring import ItemResult, answer_scores


class SampleResult(BaseModel):
    """One sampled answer to one question (a line of samples.jsonl)."""

    dataset: str
    id: str
    sample: int
    answer: str | None
    em: float
    f1: float
    trajectory_id: str | None = None
    policy_version: str | None = None
    retriever_version: str | None = None


class QuestionScore(BaseModel):
    """One question's evaluation: the greedy answer's EM/F1 (EM@1) and the mean over its K sampled answers."""

    dataset: str
    id: str
    em_greedy: float | None
    f1_greedy: float | None
    em_sampled: float | None
    f1_sampled: float | None
    samples: int
    logprob: float | None = None
    logprob_per_token: float | None = None


def per_question(
    greedy: Sequence[ItemResult], samples: Sequence[SampleResult], logprobs: Sequence | None = None
) -> list[QuestionScore]:
    """One row per question, in the order questions first appear (greedy results first): greedy EM/F1, the mean
    EM/F1 of its samples (None when it has none), and, when given, the gold answer's log-probability (rows with
    `dataset`, `id`, `logprob`, `tokens`, as `services.eval.logprob.answer_logprobs` returns)."""
    order: dict[tuple[str, str], None] = {}
    by_greedy = {}
    for r in greedy:
        order.setdefault((r.dataset, r.id))
        by_greedy[(r.dataset, r.id)] = r
    by_sample: dict[tuple[str, str], list[SampleResult]] = {}
    for s in samples:
        order.setdefault((s.dataset, s.id))
        by_sample.setdefault((s.dataset, s.id), []).append(s)
    by_logprob = {(row.dataset, row.id): row for row in logprobs or []}
    rows = []
    for key in order:
        g, ss, lp = by_greedy.get(key), by_sample.get(key, []), by_logprob.get(key)
        rows.append(
            QuestionScore(
                dataset=key[0], id=key[1],
                em_greedy=None if g is None else g.em, f1_greedy=None if g is None else g.f1,
                em_sampled=sum(s.em for s in ss) / len(ss) if ss else None,
                f1_sampled=sum(s.f1 for s in ss) / len(ss) if ss else None,
                samples=len(ss),
                logprob=None if lp is None else lp.logprob,
                logprob_per_token=None if lp is None else lp.logprob / max(lp.tokens, 1),
            )
        )  # fmt: skip
    return rows


def summarize_questions(rows: Sequence[QuestionScore]) -> dict[str, dict[str, float | int | None]]:
    """Per dataset and over all questions: the mean of each metric (over the questions that have it) and n."""
    scopes: dict[str, list[QuestionScore]] = {}
    for r in rows:
        scopes.setdefault(r.dataset, []).append(r)
    scopes["all"] = list(rows)
    out: dict[str, dict[str, float | int | None]] = {}
    for scope, rs in scopes.items():
        entry: dict[str, float | int | None] = {"n": len(rs)}
        for metric in ("em_greedy", "f1_greedy", "em_sampled", "f1_sampled", "logprob", "logprob_per_token"):
            values = [getattr(r, metric) for r in rs if getattr(r, metric) is not None]
            entry[metric] = sum(values) / len(values) if values else None
        out[scope] = entry
    return out


def chunks(items: Sequence[EvalItem], samples: int, max_trajectories: int = 256) -> list[list[EvalItem]]:
    """Split the questions so that no request asks for more than `max_trajectories` (items x samples), and none
    mixes datasets (ids are unique only within a dataset)."""
    per = max(1, max_trajectories // samples)
    by_dataset: dict[str, list[EvalItem]] = {}
    for item in items:
        by_dataset.setdefault(item.dataset, []).append(item)
    return [rows[i : i + per] for rows in by_dataset.values() for i in range(0, len(rows), per)]


def sample_answers(
    client,
    items: Sequence[EvalItem],
    *,
    samples: int = 8,
    temperature: float = 1.0,
    retrieval_temperature: float = 0.05,
    seed: int = 0,
    max_turns: int = 2,
    top_k: int = DEFAULT_TOP_K,
    per_request: int = 64,
    progress: bool = True,
    on_result: Callable[[SampleResult], None] | None = None,
) -> list[SampleResult]:
    """`samples` answers to every item through `client` (a `PolicyClient`) at the active versions, `per_request`
    trajectories a request; sample s of item i is seeded from (seed, its request position), so the same call
    draws the same answers."""
    from services.common.schemas.policy import RolloutItem, RolloutRequest

    out: list[SampleResult] = []
    with tqdm(total=len(items) * samples, desc="sampling", unit="answer", disable=not progress) as bar:
        for c, chunk in enumerate(chunks(items, samples, per_request)):
            request = RolloutRequest(
                items=[RolloutItem(id=item.id, question=item.question, golden_answers=item.golden_answers)
                       for item in chunk],
                group_size=samples, temperature=temperature, retrieval_temperature=retrieval_temperature,
                seed=seed * 1_000 + c, max_turns=max_turns, top_k=top_k,
            )  # fmt: skip
            response = client.rollouts(request)
            by_id = {item.id: item for item in chunk}
            counts: dict[str, int] = {}
            for t in response.trajectories:
                item = by_id[t.item_id]
                em, f1 = answer_scores(t.answer, item)
                result = SampleResult(dataset=item.dataset, id=item.id, sample=counts.get(item.id, 0),
                                      answer=t.answer, em=em, f1=f1, trajectory_id=t.trajectory_id,
                                      policy_version=t.policy_version,
                                      retriever_version=t.retriever_version)  # fmt: skip
                counts[item.id] = result.sample + 1
                out.append(result)
                if on_result is not None:
                    on_result(result)
            bar.update(len(chunk) * samples)
    return out


def write_sampled(
    out: Path,
    client,
    greedy: Sequence[ItemResult],
    items: Sequence[EvalItem],
    logprobs: Sequence | None = None,
    **sampling,
) -> dict[str, dict[str, float | int | None]]:
    """Sample `items` (keyword arguments of `sample_answers`), then write samples.jsonl, questions.jsonl (one
    `QuestionScore` per question, with the agent-mode greedy result of `greedy`) and sampled.json (their means per
    dataset and overall, and the sampling settings); returns the means."""
    from services.common.checkpoints import write_json_atomic

    with (out / "samples.jsonl").open("w") as fh:
        results = sample_answers(client, items, on_result=lambda r: fh.write(r.model_dump_json() + "\n"), **sampling)
    rows = per_question([r for r in greedy if r.mode == "agent"], results, logprobs)
    (out / "questions.jsonl").write_text("".join(r.model_dump_json() + "\n" for r in rows))
    means = summarize_questions(rows)
    write_json_atomic(out / "sampled.json", {"sampling": sampling, "scopes": means})
    return means
