"""The warm start's examples: training-pool questions, the retriever they search (the retriever service's
own code, in-process), and the SFT trajectories built from what it shows."""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from pydantic import BaseModel, Field

from services.common.answers import normalize_answer
from services.common.schemas.policy import TrajectoryRecord, TurnRecord
from services.common.schemas.retriever import DEFAULT_TOP_K, SearchResponse
from services.data.datasets import EvalItem, row_fields
from services.data.split import training_rows

MULTI_HOP = frozenset({"hotpotqa", "2wikimultihopqa", "musique"})
# The agent's thoughts in the SFT targets: short and fixed, so they cost few tokens at serving time while making
# every trajectory well formed in Search-R1's sense (a <think> before each <search> and <answer>).
THINK_SEARCH = "<think> I need to search for this. </think>\n"
THINK_MORE = "<think> I need more information about {title}. </think>\n"
THINK_ANSWER = "<think> I found the answer. </think>\n"
# A search the agent writes must fit one generation turn: copying a 300-token clinical vignette (MedQA) ran past
# the turn's token cap, so the agent neither searched nor answered. Long questions search by their first sentence.
QUERY_MAX_WORDS = 32
OPTIONS_MARK = "\nOptions:"


class PoolItem(EvalItem):
    """One training-pool question (FlashRAG layout) with its line position in its dataset file."""

    position: int = Field(ge=0, description="0-based line of the question in <dataset>.jsonl")


def pool_item(dataset: str, position: int, row: dict[str, Any]) -> PoolItem:
    return PoolItem(position=position, **row_fields(row, dataset) | {"dataset": dataset})


def training_pool(qa_dir: Path, dataset: str) -> list[PoolItem]:
    """The training-pool questions of `dataset` (services/data/split.py: never the evaluation split)."""
    return [pool_item(dataset, position, row) for position, row in training_rows(qa_dir, dataset)]


class WarmstartRetriever(Protocol):
    """What building the trajectories needs of a retriever: the retriever service's own code run in-process
    (services/retriever/inprocess.py), so the `<information>` blocks are exactly what serving shows."""

    async def search(self, queries: list[str], **params: Any) -> SearchResponse: ...

    def count(self) -> int: ...

    async def ingest(self, files: Sequence[Path], batch_size: int = 256) -> int: ...

    def titles(self, doc_ids: Sequence[str]) -> dict[str, tuple[str, str]]: ...


@dataclass(frozen=True)
class Shown:
    """One search as the agent saw it: its query and the passages shown (id, title, text)."""

    query: str
    docs: tuple[tuple[str, str, str], ...]

    @property
    def ids(self) -> list[str]:
        return [d[0] for d in self.docs]

    @classmethod
    def of(cls, query: str, result: Any) -> Shown:
        """The search of `query` and the passages of its result (one item of a SearchResponse)."""
        return cls(query, tuple((d.id, d.title, d.text) for d in result.docs))


def search_query(question: str, max_words: int = QUERY_MAX_WORDS) -> str:
    """The first search's query: the question without its lettered options; one longer than `max_words` words is
    cut to its first sentence (and that to `max_words` words), so the search fits a generation turn."""
    stem = question.split(OPTIONS_MARK, 1)[0].strip()
    if len(stem.split()) <= max_words:
        return stem
    first = re.split(r"(?<=[.?!])\s+", stem, maxsplit=1)[0]
    return " ".join(first.split()[:max_words])


def choose_answer(golden_answers: Sequence[str], shown_texts: Iterable[str]) -> str:
    """The gold alias to write as the target: the first one the shown passages contain (normalised, on word
    boundaries), else the first that reads like a name (mixed case, e.g. TriviaQA's 'Gerry Adams' over its
    'adams gerry'), else the first."""
    text = f" {normalize_answer(' '.join(shown_texts))} "
    for gold in golden_answers:
        norm = normalize_answer(gold)
        if norm and f" {norm} " in text:
            return gold.strip()
    for gold in golden_answers:
        if gold != gold.lower() and gold != gold.upper():
            return gold.strip()
    return golden_answers[0].strip()


def second_search_target(item: PoolItem, first: Shown, passages: dict[str, tuple[str, str]]) -> tuple[str, str] | None:
    """For a multi-hop question whose first search missed a supporting passage: (doc id, title) of the passage to
    search for next, preferring the one that holds the answer. None when nothing is missing (or unknown)."""
    if item.dataset not in MULTI_HOP:
        return None
    missing = [d for d in item.supporting_doc_ids if d not in first.ids and d in passages]
    if not missing:
        return None
    golds = [f" {normalize_answer(g)} " for g in item.golden_answers if normalize_answer(g)]

    def holds_answer(doc_id: str) -> bool:
        title, text = passages[doc_id]
        body = f" {normalize_answer(title + ' ' + text)} "
        return any(g in body for g in golds)

    target = next((d for d in missing if holds_answer(d)), missing[0])
    title = passages[target][0].strip()
    return (target, title) if title else None


def search_turn_text(query: str, title: str | None = None) -> str:
    from services.modeling.prompt import SEARCH_STOP

    think = THINK_SEARCH if title is None else THINK_MORE.format(title=title)
    return f"{think}<search> {query} {SEARCH_STOP}"


def answer_turn_text(answer: str) -> str:
    from services.modeling.prompt import ANSWER_STOP

    return f"{THINK_ANSWER}<answer> {answer} {ANSWER_STOP}"


def answer_token_mask(tokenizer: Any, turn_text: str, answer: str) -> list[int]:
    """1 on the tokens of `turn_text` (tokenised as the agent loop does) that overlap the answer inside its
    `<answer>` tag, else 0."""
    start = turn_text.rindex(f"<answer> {answer}") + len("<answer> ")
    end = start + len(answer)
    offsets = tokenizer(turn_text, add_special_tokens=False, return_offsets_mapping=True)["offset_mapping"]
    return [int(lo < end and hi > start) for lo, hi in offsets]


def build_record(tokenizer: Any, item: PoolItem, searches: Sequence[Shown], answer: str) -> TrajectoryRecord:
    """The SFT trajectory as the agent loop would have recorded it: the served prompt, then per search a
    generated turn (think + <search>) and its observation (the <information> block, tokenised on its own as
    the loop does), then the answer turn ending in EOS. `generated_mask` is then exactly the RL mask."""
    from services.modeling.prompt import build_prompt, format_information

    def ids(text: str) -> list[int]:
        return tokenizer(text, add_special_tokens=False)["input_ids"]

    prompt = build_prompt(tokenizer, item.question)
    turns = []
    for i, shown in enumerate(searches):
        text = search_turn_text(shown.query, None if i == 0 else shown.query)
        observation = format_information([(title, body) for _, title, body in shown.docs])
        generated = ids(text)
        turns.append(
            TurnRecord(
                generated_ids=generated,
                generated_logprobs=[0.0] * len(generated),
                text=text,
                finish_reason="stop",
                observation_ids=ids(observation),
            )
        )
    text = answer_turn_text(answer)
    generated = [*ids(text), tokenizer.eos_token_id]
    turns.append(
        TurnRecord(generated_ids=generated, generated_logprobs=[0.0] * len(generated), text=text, finish_reason="stop")
    )
    return TrajectoryRecord(
        id=f"warmstart-{item.dataset}-{item.id}",
        item_id=item.id,
        question=item.question,
        golden_answers=item.golden_answers,
        prompt=prompt,
        prompt_ids=ids(prompt),
        turns=turns,
        answer=answer,
        policy_version="warmstart-sft",
        retriever_version="base",
        sampling={"warmstart": 1},
        created_at=0.0,
    )


class SFTExample(BaseModel):
    id: str
    dataset: str
    input_ids: list[int]
    loss_mask: list[int] = Field(description="TrajectoryRecord.generated_mask: 1 on the agent's own tokens")
    answer_mask: list[int] | None = Field(None, description="1 on the answer's tokens inside <answer>")
    kind: str = Field("protocol", description="protocol | reading | reading-second-search | reading-bridge")
    variant: int = Field(0, ge=0, description="Which of the question's reading variants")
    searches: list[str]
    answer: str
    answer_shown: bool = Field(description="the chosen gold alias occurs in the shown passages")
    support_recall: float | None = Field(None, description="share of supporting passages shown, over all searches")


def to_example(tokenizer: Any, item: PoolItem, searches: Sequence[Shown], answer: str | None = None) -> SFTExample:
    shown_texts = [f"{title} {body}" for s in searches for _, title, body in s.docs]
    # A multiple-choice question is answered by its letter: one token, and the form its gold list gives first.
    if answer is None:
        answer = item.choice[0] if item.choice else choose_answer(item.golden_answers, shown_texts)
    record = build_record(tokenizer, item, searches, answer)
    final = record.turns[-1]
    answer_mask = [0] * (len(record.token_ids) - len(final.generated_ids))
    answer_mask += answer_token_mask(tokenizer, final.text, answer) + [0]  # the EOS after the turn's text
    norm = normalize_answer(answer)
    shown_ids = {d for s in searches for d in s.ids}
    support = item.supporting_doc_ids
    return SFTExample(
        id=item.id,
        dataset=item.dataset,
        input_ids=record.token_ids,
        loss_mask=record.generated_mask,
        answer_mask=answer_mask,
        searches=[s.query for s in searches],
        answer=answer,
        answer_shown=bool(norm) and f" {norm} " in f" {normalize_answer(' '.join(shown_texts))} ",
        support_recall=sum(d in shown_ids for d in support) / len(support) if support else None,
    )


async def build_examples(
    retriever: WarmstartRetriever,
    tokenizer: Any,
    items: Sequence[PoolItem],
    top_k: int = DEFAULT_TOP_K,
    batch: int = 64,
) -> list[SFTExample]:
    """Search with each question (greedy top-k, as serving), then, for multi-hop questions whose supporting
    passages the first search missed, search for the missing passage's title; keep that second search only when
    it shows the passage. One retriever call per batch of questions."""
    from tqdm import tqdm

    examples = []
    for start in tqdm(range(0, len(items), batch), desc="build trajectories", unit="batch"):
        chunk = items[start : start + batch]
        queries = [search_query(i.question) for i in chunk]
        response = await retriever.search(queries, top_k=top_k, candidates=top_k)
        firsts = [Shown.of(q, r) for q, r in zip(queries, response.results, strict=True)]
        passages = retriever.titles([d for i in chunk for d in i.supporting_doc_ids])
        targets = [second_search_target(i, f, passages) for i, f in zip(chunk, firsts, strict=True)]
        wanted = [(n, t) for n, t in enumerate(targets) if t is not None]
        seconds: dict[int, Shown] = {}
        if wanted:
            response = await retriever.search([t[1] for _, t in wanted], top_k=top_k, candidates=top_k)
            for (n, (doc_id, title)), result in zip(wanted, response.results, strict=True):
                shown = Shown.of(title, result)
                if doc_id in shown.ids:
                    seconds[n] = shown
        for n, (item, first) in enumerate(zip(chunk, firsts, strict=True)):
            searches = [first, seconds[n]] if n in seconds else [first]
            examples.append(to_example(tokenizer, item, searches))
    return examples
