"""Reading examples for the warm start: RAFT-style trajectories that teach the policy to read its evidence, not
only the protocol (search, then answer). A loss over every agent token is almost all template, the answer's few
tokens a tiny share of it; so a reading example, still a whole Search-R1 trajectory (the agent writes its
`<search>` and its `<answer>`), is built so that the answer must be read:

- its `<information>` block mixes the question's supporting passages with hard distractors (the real retriever's
  top non-supporting passages for the question, none of which contains a gold alias), in a seeded random order,
  so the gold passage's position carries no signal;
- its target is the answer *as the passage writes it* (the first gold alias found in a supporting passage, with
  the passage's own spelling and case), so the answer is a span the model can copy from its context;
- its answer tokens are marked (`answer_mask`) so the loss can weight them above the template;
- a share of the variants (`gold_missing`) shows only distractors on the first search; the target then searches
  again, by the supporting passage's title, and answers from what that real search shows (kept only when it shows
  a supporting passage): when the evidence lacks the answer, the agent searches again instead of guessing;
- a share of a multi-hop question's variants (`bridge`) shows the *bridge* passage on the first search (a
  supporting passage that does not hold the answer but names the title of the one that does) among distractors;
  the target searches that title and answers from what the real search shows: the agent reads the first hop to
  find what to search for the second. Without it every multi-hop example showed both hops in one block, and the
  agent learned to answer after one search whatever it showed (docs/results.md §22c).

Questions without passages (triviaqa, medqa: no corpus) keep the protocol trajectories of the first warm start,
with their answer tokens marked too.
"""

from __future__ import annotations

import random
import re
from collections.abc import Sequence
from typing import Any

from services.common.answers import contains_gold, label_answer
from services.trainer.warmstart.config import ReadingRecipe
from services.trainer.warmstart.examples import (
    PoolItem,
    SFTExample,
    Shown,
    WarmstartRetriever,
    build_examples,
    search_query,
    to_example,
)


def answer_as_written(golden_answers: Sequence[str], texts: Sequence[str]) -> str | None:
    """The first gold alias that occurs in `texts` (case-insensitive, on word boundaries, punctuation between its
    words tolerated), returned with the passage's own spelling; None when no alias occurs."""
    for gold in golden_answers:
        words = re.findall(r"\w+", gold)
        if not words:
            continue
        pattern = re.compile(r"(?<!\w)" + r"\W{1,3}".join(re.escape(w) for w in words) + r"(?!\w)", re.IGNORECASE)
        for text in texts:
            match = pattern.search(text)
            if match:
                return match.group(0)
    return None


def hard_distractors(item: PoolItem, ranked: Shown, closed_answer: bool) -> list[tuple[str, str, str]]:
    """The retriever's passages for the question that are neither supporting nor hold a gold alias (for a
    yes/no or multiple-choice question any non-supporting passage qualifies), best-ranked first."""
    support = set(item.supporting_doc_ids)
    return [
        d
        for d in ranked.docs
        if d[0] not in support and (closed_answer or not contains_gold(item.golden_answers, f"{d[1]} {d[2]}"))
    ]


def closed_answer(item: PoolItem) -> bool:
    """A multiple-choice or yes/no/maybe question: its answer is a label, not a span of the passage."""
    return item.choice is not None or label_answer(item.golden_answers)


def reading_target(item: PoolItem, gold_docs: Sequence[tuple[str, str, str]]) -> str | None:
    if item.choice is not None:
        return item.choice[0]
    if closed_answer(item):
        return item.golden_answers[0].strip()
    return answer_as_written(item.golden_answers, [f"{title}\n{text}" for _, title, text in gold_docs])


def bridge_passages(gold_docs: Sequence[tuple[str, str, str]], holds: dict[str, bool]) -> list[tuple[str, str, str]]:
    """The supporting passages that do not hold the answer but name the title of the first one that does (the
    answer-holding passage is first in `gold_docs`): a first hop that says what to search for the second."""
    if len(gold_docs) < 2 or not holds.get(gold_docs[0][0]):
        return []
    title = gold_docs[0][1]
    # `contains_gold` with the title as the string looked for: normalised, on word boundaries
    return [d for d in gold_docs[1:] if not holds.get(d[0]) and contains_gold([title], f"{d[1]} {d[2]}")]


def variant_searches(
    query: str,
    gold_docs: Sequence[tuple[str, str, str]],
    distractors: Sequence[tuple[str, str, str]],
    recipe: ReadingRecipe,
    rng: random.Random,
    second: Shown | None,
    bridges: Sequence[tuple[str, str, str]] = (),
) -> tuple[list[Shown], str] | None:
    """One variant's searches and its kind (reading: gold on the first search; reading-second-search: distractors
    only, then a search by the answer passage's title; reading-bridge: a bridge passage among distractors, then a
    search by the title it names); None when it cannot be built."""
    k = recipe.passages
    pool = list(distractors[: 2 * k])  # hard: the retriever's best non-answers, a seeded pick among them
    if rng.random() < recipe.gold_missing and second is not None and len(pool) >= k:
        first = Shown(query, tuple(rng.sample(pool, k)))
        return [first, second], "reading-second-search"
    # Drawn only when bridges are asked for, so a recipe without them builds exactly what it built before.
    if recipe.bridge > 0 and bridges and second is not None and len(pool) >= k - 1 and rng.random() < recipe.bridge:
        docs = [bridges[0], *rng.sample(pool, k - 1)]
        rng.shuffle(docs)
        return [Shown(query, tuple(docs)), second], "reading-bridge"
    golds = list(gold_docs[:k])
    need = k - len(golds)
    if len(pool) < need:
        return None
    docs = golds + rng.sample(pool, need)
    rng.shuffle(docs)
    return [Shown(query, tuple(docs))], "reading"


async def build_reading_examples(
    retriever: WarmstartRetriever,
    tokenizer: Any,
    items: Sequence[PoolItem],
    recipe: ReadingRecipe,
    seed: int,
    batch: int = 64,
) -> list[SFTExample]:
    """`recipe.variants` reading examples per question with passages; protocol examples (one per question) for
    questions whose supporting passages are not in the index. Every example's `answer_mask` marks its answer."""
    from tqdm import tqdm

    examples: list[SFTExample] = []
    fallback: list[PoolItem] = []
    for start in tqdm(range(0, len(items), batch), desc="build reading examples", unit="batch"):
        chunk = items[start : start + batch]
        passages = retriever.titles([d for i in chunk for d in i.supporting_doc_ids])
        queries = [search_query(i.question) for i in chunk]
        ranked = await retriever.search(queries, top_k=recipe.candidates, candidates=recipe.candidates)
        golds: dict[int, list[tuple[str, str, str]]] = {}
        answers: dict[int, str] = {}
        bridges: dict[int, list[tuple[str, str, str]]] = {}
        for n, item in enumerate(chunk):
            gold_docs = [(d, *passages[d]) for d in item.supporting_doc_ids if d in passages]
            answer = reading_target(item, gold_docs) if gold_docs else None
            if answer is None:
                fallback.append(item)
            else:
                # the passage that holds the answer first: it is always shown, and the second search looks for it
                holds = {d[0]: answer_as_written([answer], [f"{d[1]}\n{d[2]}"]) is not None for d in gold_docs}
                golds[n], answers[n] = sorted(gold_docs, key=lambda d: not holds[d[0]]), answer
                if not closed_answer(item):
                    bridges[n] = bridge_passages(golds[n], holds)
        # The gold-missing variants' second search: by the first supporting passage's title, kept only when the
        # real search shows a supporting passage that holds the answer (a label answer: any supporting passage).
        titles = {n: golds[n][0][1].strip() for n in golds if golds[n][0][1].strip()}
        seconds: dict[int, Shown] = {}
        if titles:
            wanted = list(titles.items())
            response = await retriever.search([t for _, t in wanted], top_k=recipe.passages, candidates=recipe.passages)
            for (n, title), result in zip(wanted, response.results, strict=True):
                shown = Shown.of(title, result)
                support = [d for d in shown.docs if d[0] in chunk[n].supporting_doc_ids]
                if support and (closed_answer(chunk[n]) or reading_target(chunk[n], support) is not None):
                    seconds[n] = shown
        for n, (item, query, result) in enumerate(zip(chunk, queries, ranked.results, strict=True)):
            if n not in golds:
                continue
            distractors = hard_distractors(item, Shown.of(query, result), closed_answer(item))
            for v in range(recipe.variants):
                rng = random.Random(f"{seed}:{item.dataset}:{item.id}:{v}")
                built = variant_searches(query, golds[n], distractors, recipe, rng, seconds.get(n), bridges.get(n, ()))
                if built is None:
                    continue
                searches, kind = built
                example = to_example(tokenizer, item, searches, answer=answers[n])
                examples.append(example.model_copy(update={"variant": v, "kind": kind}))
    if fallback:
        examples += await build_examples(retriever, tokenizer, fallback, top_k=recipe.passages)
    return examples
