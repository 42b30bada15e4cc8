"""Turns logged trajectories into the tensors a BRIDGE round needs. No optimisation here."""

from __future__ import annotations

import random
from dataclasses import dataclass, field

import torch

from services.common.answers import contains_gold, label_answer
from services.common.schemas.policy import TrajectoryRecord
from services.modeling.prompt import format_information
from services.modeling.tokens import split_ids
from services.trainer.algo.config import AlgoConfig
from services.trainer.algo.losses import grpo_advantages


@dataclass
class SearchSample:
    """One sampled retrieval: what p_phi chose among the candidates, and under which deployed scores."""

    trajectory: int
    query: str
    candidate_ids: list[str]
    deployed_scores: torch.Tensor  # (M,) the live retriever's scores when it was sampled
    chosen: torch.Tensor  # (k,) indices into the candidates, in draw order
    temperature: float
    behaviour_logprob: float | None  # None for a greedy (served) retrieval: no retrieval-credit term
    old_logprob: float | None = None  # the same draw scored by the trainer under phi_old (set by the round)
    turn_text: str = ""  # what the policy wrote in the turn that searched (its think and its <search> tag)


@dataclass
class QSample:
    """Q_theta inputs for one search step: x + d + y* for a subset of its candidates."""

    search: int
    candidates: list[int]  # indices into that step's candidates
    context_ids: list[list[int]]  # one x + d per candidate
    answer_ids: list[int]  # y*
    log_prior: torch.Tensor | None = None  # log p_deployed over `candidates`, for the posterior target


@dataclass
class RoundBatch:
    records: list[TrajectoryRecord]
    rewards: torch.Tensor  # (B,)
    advantages: torch.Tensor  # (B,)
    searches: list[SearchSample]
    q_samples: list[QSample]
    doc_texts: dict[str, str]
    doc_titles: dict[str, str] = field(default_factory=dict)
    sequence_weights: torch.Tensor | None = None  # (B,) extra per-trajectory weights (none by default)
    old_logps: list[torch.Tensor] | None = None  # per record (T_i,): theta_old's log-probs, set by the round
    tis_weights: list[torch.Tensor] | None = None  # per record (T_i,): min(cap, pi_old / pi_behaviour)

    def temperature(self, i: int) -> float:
        """The decoding temperature record i was sampled at (its own record, never a trainer default)."""
        value = self.records[i].sampling.get("temperature")
        return float(value) if value else 1.0

    @property
    def sampled(self) -> list[SearchSample]:
        return [s for s in self.searches if s.behaviour_logprob is not None]


def order_groups(records: list[TrajectoryRecord]) -> list[TrajectoryRecord]:
    """Consecutive groups of one item each, in a stable order, as `grpo_advantages` expects."""
    return sorted(records, key=lambda r: (r.item_id or "", r.group_index or 0))


def build_batch(
    records: list[TrajectoryRecord],
    cfg: AlgoConfig,
    tokenizer,
    docs: dict[str, tuple[str, str]],
    baseline: float | None = None,
    with_q: bool = True,
) -> RoundBatch:
    """`docs`: id -> (title, text) for every candidate id in the records (with `with_q=False`, no Q_theta
    samples are built, so none are needed).

    With `baseline` (live trajectories come alone, not in groups) advantages are r_i - baseline, a running
    mean kept by the run; otherwise GRPO's group normalisation."""
    records = order_groups(records)
    rewards = torch.tensor([float(r.reward or 0.0) for r in records])
    advantages = rewards - baseline if baseline is not None else grpo_advantages(rewards, cfg.group_size)
    searches: list[SearchSample] = []
    for i, record in enumerate(records):
        for turn in record.turns:
            step = turn.search
            if step is None or not step.candidates:
                continue
            ids = [str(c["id"]) for c in step.candidates]
            searches.append(
                SearchSample(
                    trajectory=i,
                    query=step.query,
                    candidate_ids=ids,
                    deployed_scores=torch.tensor([float(c["score"]) for c in step.candidates]),
                    chosen=torch.tensor([ids.index(c) for c in step.chosen_ids]),
                    temperature=step.temperature,
                    behaviour_logprob=step.logprob,
                    turn_text=turn.text,
                )
            )
    q_samples = build_q_samples(records, searches, cfg, tokenizer, docs) if cfg.needs_q and with_q else []
    return RoundBatch(
        records=records,
        rewards=rewards,
        advantages=advantages,
        searches=searches,
        q_samples=q_samples,
        doc_texts={k: f"{t}\n{x}" if t else x for k, (t, x) in docs.items()},
        doc_titles={k: t for k, (t, _) in docs.items()},
    )


ANSWER_OPEN = "<answer>"


def search_prefix(search: SearchSample) -> str:
    """The policy's own search turn (its think, then `<search> q </search>`) when the record holds it, else the
    bare tag with the query."""
    text = search.turn_text.rstrip()
    if "<search>" in text and text.endswith("</search>"):
        return text
    return f"<search> {search.query} </search>"


def answer_prefix(record: TrajectoryRecord) -> str:
    """What the policy wrote in its answer turn up to and including `<answer>` (the warm start's `<think> I found
    the answer. </think>` first), so y* is scored where the policy's answer starts; `<answer>` alone when the
    trajectory never opened one."""
    for turn in reversed(record.turns):
        cut = turn.text.rfind(ANSWER_OPEN)
        if cut >= 0:
            return turn.text[: cut + len(ANSWER_OPEN)]
    return ANSWER_OPEN


def target_answer(record: TrajectoryRecord, kind: str = "golden") -> str | None:
    """y* for a record's question (`AlgoConfig.target_answer`): its first golden answer, else (kind "rewarded")
    its own answer when it was rewarded; None: no target for its searches."""
    if record.golden_answers:
        return record.golden_answers[0]
    if kind == "rewarded" and record.answer and (record.reward or 0) > 0:
        return record.answer
    return None


def spread_subsample(
    records, searches: list[SearchSample | None], q_steps: int, seed: int, target: str = "golden"
) -> list[int]:
    """Up to `q_steps` search indices with distinct (query, candidate set), spread over the round's questions:
    questions in a seeded order, round-robin, one not-yet-taken distinct search of each per pass. Searches of
    one question's G rollouts often share query and candidates (the initial-search scaffold); those count once."""
    rng = random.Random(seed)
    by_question: dict[str, list[int]] = {}
    seen: set[tuple[str, tuple[str, ...]]] = set()
    for s, search in enumerate(searches):
        if search is None:  # left out by the caller
            continue
        record = records[search.trajectory]
        key = (search.query, tuple(search.candidate_ids))
        if target_answer(record, target) is None or key in seen:
            continue
        seen.add(key)
        by_question.setdefault(record.item_id or record.question, []).append(s)
    questions = sorted(by_question)
    rng.shuffle(questions)
    for question in questions:
        rng.shuffle(by_question[question])
    picked: list[int] = []
    while len(picked) < q_steps and any(by_question[q] for q in questions):
        for question in questions:
            if by_question[question] and len(picked) < q_steps:
                picked.append(by_question[question].pop())
    return sorted(picked)


def top_q_candidates(search: SearchSample, cfg: AlgoConfig) -> list[int]:
    """The `q_candidates` best-scored candidates of a search, which Q_theta ranks."""
    return torch.argsort(search.deployed_scores, descending=True)[: cfg.q_candidates].tolist()


def informative(record: TrajectoryRecord, search: SearchSample, cfg: AlgoConfig, docs) -> bool:
    """Whether a y*-scored teacher can rank this search's candidates: y* is a span (not a yes/no label) and some,
    not all, of the top `q_candidates` write a gold alias."""
    target = target_answer(record, cfg.target_answer)
    golden = record.golden_answers or ([target] if target else [])
    if not golden or label_answer(golden):
        return False
    holds = {contains_gold(golden, " ".join(docs[search.candidate_ids[c]])) for c in top_q_candidates(search, cfg)}
    return holds == {True, False}


def build_q_samples(records, searches, cfg: AlgoConfig, tokenizer, docs) -> list[QSample]:
    """The configured subsample (`spread_subsample`, seeded by `cfg.seed`), each search with its `q_candidates`
    best-scored candidates; short x + d + y* sequences (the doc cut to `q_doc_tokens`), each tokenized as the one
    string the policy would have written (`split_ids`).

    Only sampled searches: a greedy (served) search has no sampling distribution over its candidates, so neither
    Q_theta's prior nor g's p_phi would be the distribution that chose its documents."""
    sampled = [s if s.behaviour_logprob is not None else None for s in searches]
    if cfg.q_informative_only:
        sampled = [s if s is not None and informative(records[s.trajectory], s, cfg, docs) else None for s in sampled]
    out: list[QSample] = []
    for s in spread_subsample(records, sampled, cfg.q_steps, cfg.seed, cfg.target_answer):
        search = searches[s]
        record = records[search.trajectory]
        top = top_q_candidates(search, cfg)
        prompt = record.prompt  # exactly what the policy was shown
        contexts, answers = [], []
        answer = f" {target_answer(record, cfg.target_answer)} </answer>"  # the warm start's `<answer> X </answer>`
        before, after = search_prefix(search), answer_prefix(record)
        for c in top:
            title, text = docs[search.candidate_ids[c]]
            text_ids = tokenizer(text, add_special_tokens=False)["input_ids"][: cfg.q_doc_tokens]
            observation = format_information([(title, tokenizer.decode(text_ids))])
            context_ids, answer_ids = split_ids(tokenizer, f"{prompt}{before}{observation}{after}", answer)
            contexts.append(context_ids)
            answers.append(answer_ids)
        if any(a != answers[0] for a in answers):  # the context ends on the same answer prefix for every candidate
            raise ValueError(f"y* tokenizes differently after different candidates: {answers}")
        answer_ids = answers[0]
        log_prior = torch.log_softmax(search.deployed_scores[top] / search.temperature, dim=-1)
        out.append(QSample(search=s, candidates=top, context_ids=contexts, answer_ids=answer_ids, log_prior=log_prior))
    return out
