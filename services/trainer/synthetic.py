"""Rollout batches built in-process, without the services, for benches and experiments: real retrieval scores
(the trainer's own encoder over a question's candidate passages), a Plackett–Luce draw of the shown documents,
and a real policy sample after them, recorded exactly as the policy service records a trajectory.

The one rollout builder: `sample_search` (the prompt, a Plackett–Luce draw of the shown documents and the
observation) and `rollout_record` (the behaviour log-probs and the record) are what every hand-made batch uses, the
unit tests' scripted answers included; `build_rollouts` is the demo-data batch of the benches and experiments.

`gold_every`: every n-th rollout of a group answers with the gold answer after its sample (so a group's rewards
differ and GRPO has a signal even where the small policy is never right); rewards are exact match.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from tqdm import tqdm

from services.common.answers import exact_match, extract_answer
from services.common.schemas.policy import SearchStep, TrajectoryRecord, TurnRecord
from services.modeling.plackett_luce import gumbel_top_k, plackett_luce_logprob
from services.modeling.prompt import build_prompt, format_information
from services.trainer.models import PolicyModel, RetrieverModel

DEMO = Path(__file__).resolve().parents[1] / "demo_data"


def demo_data() -> tuple[list[dict], dict[str, dict]]:
    items = [json.loads(line) for line in (DEMO / "hotpotqa_train.jsonl").open()]
    corpus = {row["id"]: row for row in map(json.loads, (DEMO / "hotpotqa_corpus.jsonl").open())}
    return items, corpus


@dataclass
class SearchTurn:
    """A rollout's first turn: the prompt, `shown` documents drawn from the candidates, and the observation."""

    prompt: str
    prompt_ids: list[int]
    observation_ids: list[int]
    step: SearchStep
    docs: list[tuple[str, str]]  # (title, text) of the shown documents


def sample_search(
    tokenizer: Any,
    question: str,
    candidates: list[str],
    scores: np.ndarray,
    passages: dict[str, tuple[str, str]],
    rng: np.random.Generator,
    *,
    shown: int,
    temperature: float,
    suffix: str = "",
    query: str | None = None,
) -> SearchTurn:
    """Draw `shown` of `candidates` (scores (C,)) by Gumbel top-k at `temperature`; `suffix` ends the observation
    (e.g. an `<answer>` prefill)."""
    logits = scores / temperature
    chosen = gumbel_top_k(logits, shown, rng)
    prompt = build_prompt(tokenizer, question)
    prompt_ids = tokenizer(prompt, add_special_tokens=False)["input_ids"]
    docs = [passages[candidates[c]] for c in chosen]
    query = question if query is None else query
    observation = f"<search> {query} </search>" + format_information(docs) + suffix
    observation_ids = tokenizer(observation, add_special_tokens=False)["input_ids"]
    step = SearchStep(
        turn=0, query=query,
        candidates=[{"id": c, "score": float(s)} for c, s in zip(candidates, scores, strict=True)],
        chosen_ids=[candidates[c] for c in chosen], chosen_titles=[d[0] for d in docs],
        logprob=plackett_luce_logprob(logits, chosen), mode="sample", temperature=temperature,
        retriever_version="base",
    )  # fmt: skip
    return SearchTurn(prompt, prompt_ids, observation_ids, step, docs)


def rollout_record(
    policy: PolicyModel,
    search: SearchTurn,
    generated_ids: list[int],
    *,
    record_id: str,
    item_id: Any,
    group_index: int,
    golden_answers: list[str],
    text: str,
    answer: str | None,
    reward: float,
    **fields: Any,
) -> TrajectoryRecord:
    """The trajectory as the policy service records it, with `generated_ids`' behaviour log-probs under `policy`;
    `fields`: any other TrajectoryRecord field (em, sampling)."""
    context = search.prompt_ids + search.observation_ids
    with torch.no_grad():
        behaviour = policy.token_logps(context + generated_ids, len(context))
    return TrajectoryRecord(
        id=record_id, item_id=item_id, group_index=group_index, question=search.step.query,
        golden_answers=golden_answers, prompt=search.prompt, prompt_ids=search.prompt_ids,
        turns=[
            TurnRecord(generated_ids=[], generated_logprobs=[], text="", observation_ids=search.observation_ids,
                       search=search.step),
            TurnRecord(generated_ids=generated_ids, generated_logprobs=behaviour.tolist(), text=text),
        ],
        answer=answer, policy_version="base", retriever_version="base", reward=reward, created_at=0.0, **fields,
    )  # fmt: skip


def build_rollouts(
    policy: PolicyModel,
    retriever: RetrieverModel,
    items: list[dict],
    corpus: dict[str, dict],
    *,
    group: int = 2,
    seed: int = 0,
    distractors: int = 10,
    shown: int = 3,
    temperature: float = 0.05,
    max_new_tokens: int = 64,
    gold_every: int = 0,
    progress: bool = False,
) -> tuple[list[TrajectoryRecord], dict[str, tuple[str, str]]]:
    """Returns (records, docs) where docs maps every candidate id to (title, text), as `build_batch` wants."""
    tok, rng = policy.tokenizer, np.random.default_rng(seed)
    ids_all = sorted(corpus)
    records: list[TrajectoryRecord] = []
    for n, item in enumerate(tqdm(items, desc="rollouts", disable=not progress)):
        extra = [ids_all[i] for i in rng.choice(len(ids_all), distractors, replace=False)]
        candidates = list(dict.fromkeys(item["metadata"]["context_doc_ids"] + extra))
        texts = {c: f"{corpus[c]['title']}\n{corpus[c]['text']}" for c in candidates}
        with torch.no_grad():
            query = retriever.query([item["question"]])[0]
            scores = (retriever.doc_vectors(candidates, texts) @ query).numpy()
        passages = {c: (corpus[c]["title"], corpus[c]["text"]) for c in candidates}
        for g in range(group):
            search = sample_search(tok, item["question"], candidates, scores, passages, rng, shown=shown,
                                   temperature=temperature)  # fmt: skip
            context = search.prompt_ids + search.observation_ids
            torch.manual_seed(seed * 1_000_003 + n * 101 + g)
            with torch.no_grad():
                sample = policy.model.generate(torch.tensor([context]), max_new_tokens=max_new_tokens,
                                               do_sample=True, top_k=0, top_p=1.0)  # fmt: skip
            gen_ids = sample[0, len(context) :].tolist()
            if gold_every and g % gold_every == 0:
                text = tok.decode(gen_ids).split("<answer>")[0]
                gen_ids = tok(f"{text}<answer> {item['golden_answers'][0]} </answer>",
                              add_special_tokens=False)["input_ids"]  # fmt: skip
            text = tok.decode(gen_ids)
            answer = extract_answer(text)
            em = exact_match(answer, item["golden_answers"])
            records.append(rollout_record(
                policy, search, gen_ids, record_id=f"{item['id']}-{g}", item_id=str(item["id"]), group_index=g,
                golden_answers=item["golden_answers"], text=text, answer=answer, reward=em, em=em,
                sampling={"temperature": 1.0, "retrieval_temperature": temperature, "top_k": shown},
            ))  # fmt: skip
    docs = {c: (corpus[c]["title"], corpus[c]["text"]) for r in records for c in
            (str(x["id"]) for x in r.turns[0].search.candidates)}  # fmt: skip
    return records, docs
