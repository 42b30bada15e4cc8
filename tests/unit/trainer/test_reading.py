"""Reading examples (issue 38): the answer as the passage writes it, hard distractors without the answer, the gold
passage at a seeded position, the gold-missing variant that searches again, the bridge variant that reads the first
hop to search the second, and the answer's token mask."""

from __future__ import annotations

import asyncio
import json
import random
from collections import Counter

from services.common.answers import contains_gold, valid_search_r1_sequence
from services.retriever.inprocess import InProcessRetriever
from services.trainer.warmstart.config import ReadingRecipe
from services.trainer.warmstart.examples import PoolItem, Shown, to_example
from services.trainer.warmstart.reading import (
    answer_as_written,
    bridge_passages,
    build_reading_examples,
    closed_answer,
    hard_distractors,
    reading_target,
    variant_searches,
)


def _item(golds=("Anna Clyne",), support=("g1",), dataset="nq", choice=None) -> PoolItem:
    return PoolItem(
        id="q1", dataset=dataset, position=150, question="Who composed Night Ferry?", golden_answers=list(golds),
        supporting_doc_ids=list(support), choice=choice,
    )  # fmt: skip


def test_the_target_is_the_alias_with_the_passages_spelling():
    text = "Night Ferry is a piece by the British composer ANNA CLYNE, first played in 2012."
    assert answer_as_written(["anna clyne"], [text]) == "ANNA CLYNE"
    # the first alias that occurs wins; punctuation between an alias's words is tolerated, words are whole
    assert answer_as_written(["Super Bowl LII,", "2012"], [text]) == "2012"
    assert answer_as_written(["Super Bowl LII"], ["won Super Bowl LII, in 2018"]) == "Super Bowl LII"
    assert answer_as_written(["U.S."], ["the U.S. army"]) == "U.S"
    assert answer_as_written(["Clyne"], ["Clynes"]) is None
    assert answer_as_written(["x"], []) is None


def test_label_questions_answer_with_their_label():
    assert closed_answer(_item(golds=("yes",))) and closed_answer(
        _item(golds=("C", "Aspirin"), choice=("C", "Aspirin"))
    )
    assert not closed_answer(_item())
    assert reading_target(_item(golds=("C", "Aspirin"), choice=("C", "Aspirin")), [("g1", "t", "aspirin")]) == "C"
    assert reading_target(_item(golds=("maybe",)), [("g1", "t", "unrelated")]) == "maybe"
    assert reading_target(_item(), [("g1", "Night Ferry", "by anna clyne")]) == "anna clyne"
    assert reading_target(_item(), [("g1", "Night Ferry", "an orchestral piece")]) is None


def test_hard_distractors_hold_neither_support_nor_answer():
    ranked = Shown("q", (("g1", "Night Ferry", "by Anna Clyne"), ("d1", "Clyne", "Anna Clyne was born in London"),
                         ("d2", "Ferry", "a boat"), ("d3", "Night", "darkness")))  # fmt: skip
    assert [d[0] for d in hard_distractors(_item(), ranked, closed_answer=False)] == ["d2", "d3"]
    assert [d[0] for d in hard_distractors(_item(), ranked, closed_answer=True)] == ["d1", "d2", "d3"]


def test_variants_put_the_gold_passage_anywhere_and_sometimes_leave_it_out():
    gold = [("g1", "Night Ferry", "by Anna Clyne")]
    distractors = [(f"d{i}", f"t{i}", "x") for i in range(8)]
    second = Shown("Night Ferry", tuple(gold))
    recipe = ReadingRecipe(passages=3, gold_missing=0.25)
    positions, missing = Counter(), 0
    for seed in range(400):
        searches, kind = variant_searches("q", gold, distractors, recipe, random.Random(seed), second)
        if kind != "reading":
            assert kind == "reading-second-search"
            missing += 1
            assert len(searches) == 2 and searches[1] is second and "g1" not in searches[0].ids
            continue
        [shown] = searches
        assert len(shown.docs) == 3 and len(set(shown.ids)) == 3
        assert all(d in [f"d{i}" for i in range(6)] for d in shown.ids if d != "g1")  # the hardest 2k only
        positions[shown.ids.index("g1")] += 1
    assert 60 < missing < 140  # ~25 % of 400
    assert min(positions.values()) > 70  # every position, about equally often
    # no second search that shows the gold: the variant keeps the gold on its first search
    for seed in range(50):
        _, kind = variant_searches("q", gold, distractors, recipe, random.Random(seed), None)
        assert kind == "reading"
    assert variant_searches("q", gold, distractors[:1], recipe, random.Random(0), None) is None  # too few


ANSWER_DOC = ("g1", "WINNER (band)", "WINNER is a boy group formed by YG Entertainment in 2013.")
BRIDGE_DOC = ("g2", "2014 S/S", "2014 S/S is the debut album of the South Korean boy group Winner.")


def test_a_bridge_passage_names_the_answer_passages_title_and_does_not_hold_the_answer():
    assert contains_gold(["Winner"], "the boy group Winner.") and not contains_gold(["Winner"], "the winners")
    holds = {"g1": True, "g2": False}
    # the answer passage's title is "WINNER (band)": normalised, "winner band" is not in the bridge text
    assert bridge_passages([ANSWER_DOC, BRIDGE_DOC], holds) == []
    answer = ("g1", "Winner", ANSWER_DOC[2])
    assert bridge_passages([answer, BRIDGE_DOC], holds) == [BRIDGE_DOC]
    assert bridge_passages([answer, BRIDGE_DOC], {"g1": True, "g2": True}) == []  # it holds the answer too
    assert bridge_passages([BRIDGE_DOC, answer], {"g1": False, "g2": False}) == []  # no passage holds the answer
    assert bridge_passages([answer], holds) == []  # single hop


def test_bridge_variants_show_the_first_hop_then_search_the_title_it_names():
    answer = ("g1", "Winner", ANSWER_DOC[2])
    distractors = [(f"d{i}", f"t{i}", "x") for i in range(8)]
    second = Shown("Winner", (answer, ("d7", "t7", "x"), ("d6", "t6", "x")))
    kinds = Counter()
    for seed in range(400):
        recipe = ReadingRecipe(passages=3, gold_missing=0.0, bridge=0.5)
        searches, kind = variant_searches("q", [answer, BRIDGE_DOC], distractors, recipe, random.Random(seed), second,
                                          [BRIDGE_DOC])  # fmt: skip
        kinds[kind] += 1
        if kind == "reading-bridge":
            first, then = searches
            assert "g2" in first.ids and "g1" not in first.ids and len(set(first.ids)) == 3 and then is second
    assert 150 < kinds["reading-bridge"] < 250 and kinds["reading"] + kinds["reading-bridge"] == 400
    # bridge 0 (every earlier run): the same draws as before the option existed
    for seed in range(50):
        without = variant_searches("q", [answer, BRIDGE_DOC], distractors, ReadingRecipe(gold_missing=0.2),
                                   random.Random(seed), second, [BRIDGE_DOC])  # fmt: skip
        before = variant_searches("q", [answer, BRIDGE_DOC], distractors, ReadingRecipe(gold_missing=0.2),
                                  random.Random(seed), second)  # fmt: skip
        assert without == before and without[1] != "reading-bridge"


def test_the_answer_mask_marks_exactly_the_answers_tokens(tokenizer):
    shown = Shown("Who composed Night Ferry?", (("g1", "Night Ferry", "by ANNA CLYNE"),))
    example = to_example(tokenizer, _item(), [shown], answer="ANNA CLYNE")
    assert len(example.answer_mask) == len(example.input_ids)
    marked = [t for t, a in zip(example.input_ids, example.answer_mask, strict=True) if a]
    assert tokenizer.decode(marked).strip() == "ANNA CLYNE"
    assert all(m for m, a in zip(example.loss_mask, example.answer_mask, strict=True) if a)  # inside the agent's turn


CORPUS = [
    {"id": "g1", "title": "Night Ferry", "text": "Night Ferry is an orchestral piece by the composer Anna Clyne."},
    {"id": "h1", "title": "Winner", "text": "Winner is a South Korean boy group formed by YG Entertainment."},
    {"id": "h2", "title": "2014 S/S", "text": "2014 S/S is the debut album of the South Korean boy group Winner."},
    {"id": "d1", "title": "Ferry", "text": "A ferry is a boat that carries passengers across water at night."},
    {"id": "d2", "title": "Night", "text": "Night is the time between sunset and sunrise."},
    {"id": "d3", "title": "Orchestra", "text": "An orchestra is a large ensemble; Anna Clyne wrote for one."},
    {"id": "d4", "title": "Composer", "text": "A composer writes music such as orchestral pieces."},
    {"id": "d5", "title": "Chicago", "text": "Chicago has a symphony orchestra and many ferries."},
]


def test_reading_examples_with_the_real_retriever(tmp_path, models_root, tokenizer):
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text("".join(json.dumps(row) + "\n" for row in CORPUS))
    reading = _item(golds=("anna clyne",))
    no_corpus = PoolItem(id="q2", dataset="triviaqa", position=120, question="Who?", golden_answers=["Nobody"])
    hop = PoolItem(id="q3", dataset="hotpotqa", position=140, golden_answers=["YG Entertainment"],
                   question="2014 S/S is the debut album of a boy group formed by who?",
                   supporting_doc_ids=["h2", "h1"])  # fmt: skip
    recipe = ReadingRecipe(passages=3, candidates=8, variants=4, gold_missing=0.5)

    async def run(recipe, items):
        async with InProcessRetriever(tmp_path / "data", encoder_dir=models_root / "all-MiniLM-L6-v2") as retriever:
            await retriever.ingest([corpus])
            return await build_reading_examples(retriever, tokenizer, items, recipe, seed=0)

    examples = asyncio.run(run(recipe, [reading, no_corpus]))

    readings = [e for e in examples if e.id == "q1"]
    assert [e.variant for e in readings] == [0, 1, 2, 3]
    assert {e.kind for e in readings} <= {"reading", "reading-second-search"}
    assert all(e.answer == "Anna Clyne" for e in readings)  # the passage's spelling, not the gold list's
    for e in readings:
        text = tokenizer.decode(e.input_ids)
        assert "Anna Clyne wrote for one" not in text  # d3 holds the answer: never a distractor
        generated = text.split("<|im_start|>assistant\n", 1)[1].removesuffix("<|im_end|>")
        assert valid_search_r1_sequence(generated)
        if e.kind == "reading-second-search":
            assert e.searches == ["Who composed Night Ferry?", "Night Ferry"]
    [fallback] = [e for e in examples if e.id == "q2"]  # no passages: the protocol trajectory, answer marked
    assert fallback.kind == "protocol" and any(fallback.answer_mask)
    # a multi-hop question with bridge variants: the first block shows the first hop, the second search its title
    hops = asyncio.run(run(recipe.model_copy(update={"gold_missing": 0.0, "bridge": 1.0, "variants": 2}), [hop]))
    assert [e.kind for e in hops] == ["reading-bridge", "reading-bridge"]
    for e in hops:
        text = tokenizer.decode(e.input_ids)
        first_block = text.split("<information>", 2)[1]
        assert "debut album" in first_block and "formed by YG" not in first_block
        assert e.searches == [hop.question, "Winner"] and e.answer == "YG Entertainment"
        assert valid_search_r1_sequence(text.split("<|im_start|>assistant\n", 1)[1].removesuffix("<|im_end|>"))
