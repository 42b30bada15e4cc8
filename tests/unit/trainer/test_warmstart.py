"""The warm start's data: the SFT trajectory (mask = the agent's own tokens, as RL masks them), the gold alias it
writes, the second search of a multi-hop question (with the real retriever code), the loss, and the split guard."""

from __future__ import annotations

import asyncio
import json

import pytest

from services.common.answers import trajectory_text, valid_search_r1_sequence
from services.data.split import EVAL_SPLIT, SplitViolation
from services.modeling.prompt import build_prompt, format_information
from services.retriever.inprocess import InProcessRetriever
from services.trainer.warmstart.config import WarmstartConfig
from services.trainer.warmstart.data import cached_examples, select_items, split_heldout
from services.trainer.warmstart.examples import (
    PoolItem,
    SFTExample,
    Shown,
    build_examples,
    build_record,
    choose_answer,
    pool_item,
    search_query,
    second_search_target,
    to_example,
    training_pool,
)


def _item(dataset="hotpotqa", position=150, golds=("Anna Clyne",), support=("d2", "d3")) -> PoolItem:
    return PoolItem(
        id=f"q{position}",
        dataset=dataset,
        position=position,
        question="Which composer created Night Ferry?",
        golden_answers=list(golds),
        supporting_doc_ids=list(support),
    )


FIRST = Shown("Which composer created Night Ferry?", (("d1", "Night Ferry", "Night Ferry is an orchestral piece."),))
SECOND = Shown("Anna Clyne", (("d2", "Anna Clyne", "Anna Clyne is a British composer."),))


def test_mask_covers_only_the_agents_own_tokens(tokenizer):
    record = build_record(tokenizer, _item(), [FIRST, SECOND], "Anna Clyne")
    ids, mask = record.token_ids, record.generated_mask
    assert len(ids) == len(mask)
    prompt = build_prompt(tokenizer, _item().question)
    assert tokenizer.decode(ids[: len(record.prompt_ids)]) == prompt and not any(mask[: len(record.prompt_ids)])
    masked = tokenizer.decode([t for t, m in zip(ids, mask, strict=True) if m])
    assert masked == (
        "<think> I need to search for this. </think>\n<search> Which composer created Night Ferry? </search>"
        "<think> I need more information about Anna Clyne. </think>\n<search> Anna Clyne </search>"
        "<think> I found the answer. </think>\n<answer> Anna Clyne </answer><|im_end|>"
    )
    unmasked = tokenizer.decode([t for t, m in zip(ids, mask, strict=True) if not m])
    observation = format_information([("Night Ferry", "Night Ferry is an orchestral piece.")])
    assert unmasked.startswith(prompt) and observation in unmasked and "Anna Clyne is a British composer." in unmasked
    assert "<information>" not in masked and "<search>" not in unmasked[len(prompt) :]
    # the trajectory is well formed in Search-R1's sense, so em-format gives it its format credit
    assert valid_search_r1_sequence(trajectory_text(record, tokenizer))
    example = to_example(tokenizer, _item(), [FIRST, SECOND])
    assert example.loss_mask == mask and example.input_ids == ids
    assert example.answer_shown and example.support_recall == 0.5 and example.searches == [FIRST.query, "Anna Clyne"]


def test_the_gold_alias_the_passages_contain_is_the_target():
    passages = ["Gerry Adams wrote Hope and History in 2003."]
    golds = ["adams gerry", "gearoid mac adam", "Gerry Adams", "GERRY ADAMS"]
    assert choose_answer(golds, passages) == "Gerry Adams"
    assert choose_answer(["Brooklyn, New York", "Brooklyn"], ["He was born in Brooklyn."]) == "Brooklyn"
    # nothing shown: a name-like alias over a lower-cased or upper-cased one, else the first
    assert choose_answer(golds, ["unrelated"]) == "Gerry Adams"
    assert choose_answer(["yes"], ["unrelated"]) == "yes"
    # word boundaries: "Paris" is not inside "Parisian"
    assert choose_answer(["Lyon", "Paris"], ["a Parisian café in Lyon"]) == "Lyon"


def test_second_search_targets_the_missing_passage_that_holds_the_answer():
    passages = {"d2": ("Anna Clyne", "Anna Clyne is a British composer."), "d3": ("Night Ferry", "A piece.")}
    assert second_search_target(_item(), FIRST, passages) == ("d2", "Anna Clyne")
    # all supporting passages already shown, or a single-hop dataset: no second search
    shown_both = Shown("q", (("d2", "", ""), ("d3", "", "")))
    assert second_search_target(_item(), shown_both, passages) is None
    assert second_search_target(_item(dataset="nq"), FIRST, passages) is None


VIGNETTE = (
    "A 67-year-old man with transitional cell carcinoma of the bladder comes to the physician because of a 2-day "
    "history of ringing sensation in his ear. He received this first course of neoadjuvant chemotherapy 1 week ago. "
    "The expected beneficial effect of the drug is most likely due to which of the following actions?"
)
OPTIONS = {"A": "Inhibition of proteasome", "B": "Generation of free radicals", "C": "Cross-linking of DNA"}
MC_QUESTION = VIGNETTE + "\nOptions:\n" + "\n".join(f"{k}. {v}" for k, v in OPTIONS.items())


def test_the_first_query_fits_a_turn_short_questions_are_kept_whole():
    assert search_query("who sang does he love you with reba") == "who sang does he love you with reba"
    # lettered options are not searched for; a long stem searches by its first sentence
    assert search_query("Major determinant of loading dose of a drug is\nOptions:\nA. Half life\nB. Clearance") == (
        "Major determinant of loading dose of a drug is"
    )
    assert search_query(MC_QUESTION) == VIGNETTE.split(". ")[0] + "."
    # a first sentence longer than the cap is cut to it
    assert search_query(" ".join(["word"] * 80), max_words=32) == " ".join(["word"] * 32)


def test_a_multiple_choice_question_is_answered_by_its_letter(tokenizer):
    row = {
        "id": "medqa-1",
        "question": MC_QUESTION,
        "golden_answers": ["C", "Cross-linking of DNA"],
        "metadata": {"options": OPTIONS, "answer_idx": "C"},
    }
    item = pool_item("medqa", 150, row)
    assert item.choice == ("C", "Cross-linking of DNA")
    # passages that name the option text (and a stray "c") do not change the target
    shown = Shown(search_query(item.question), (("p1", "Cisplatin", "Cisplatin acts by cross-linking of DNA."),))
    example = to_example(tokenizer, item, [shown])
    assert example.answer == "C" and example.searches == [search_query(MC_QUESTION)]
    masked = tokenizer.decode([t for t, m in zip(example.input_ids, example.loss_mask, strict=True) if m])
    assert masked.endswith("<answer> C </answer><|im_end|>") and "Options" not in masked
    # a question without options keeps the alias rule
    assert pool_item("nq", 150, {"id": "n", "question": "q", "golden_answers": ["x"]}).choice is None


CORPUS = [
    {"id": "w1", "title": "Night Ferry (Clyne)", "text": "Night Ferry is an orchestral composition first performed "
     "at Symphony Center in Chicago in 2012 by the Chicago Symphony Orchestra."},
    {"id": "w2", "title": "Anna Clyne", "text": "Anna Clyne is a British composer of acoustic and electroacoustic "
     "music, born in London in 1980."},
    {"id": "w3", "title": "Symphony Center", "text": "Symphony Center is a music complex in Chicago, Illinois."},
    {"id": "w4", "title": "Chicago Symphony Orchestra", "text": "The Chicago Symphony Orchestra is an American "
     "orchestra based in Chicago."},
    {"id": "w5", "title": "Brooklyn", "text": "Brooklyn is a borough of New York City."},
]  # fmt: skip


def test_build_examples_with_the_real_retriever(tmp_path, models_root, tokenizer):
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text("".join(json.dumps(row) + "\n" for row in CORPUS))
    item = PoolItem(
        id="q1",
        dataset="hotpotqa",
        position=120,
        question="Which composer created Night Ferry first performed in 2012 at Symphony Center in Chicago?",
        golden_answers=["Anna Clyne"],
        supporting_doc_ids=["w1", "w2"],
    )

    async def run():
        async with InProcessRetriever(tmp_path / "data", encoder_dir=models_root / "all-MiniLM-L6-v2") as retriever:
            await retriever.ingest([corpus])
            first = await retriever.search([item.question], top_k=1, candidates=1)
            examples = await build_examples(retriever, tokenizer, [item], top_k=1)
            return first, examples

    first, [example] = asyncio.run(run())
    assert first.results[0].docs[0].id == "w1"  # the question reaches the first hop only
    assert example.searches == [item.question, "Anna Clyne"]  # the second search reaches the bridge entity
    assert example.support_recall == 1.0 and example.answer == "Anna Clyne" and example.answer_shown
    text = tokenizer.decode(example.input_ids)
    assert "Doc 1(Title: Anna Clyne) Anna Clyne is a British composer" in text


def test_the_warm_start_draws_from_the_training_pool_only(tmp_path):
    rows = [{"id": f"q{i}", "question": f"question {i}?", "golden_answers": ["a"]} for i in range(EVAL_SPLIT + 30)]
    (tmp_path / "nq.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    pool = training_pool(tmp_path, "nq")
    assert [i.id for i in pool] == [f"q{i}" for i in range(EVAL_SPLIT, EVAL_SPLIT + 30)]
    chosen = select_items({"nq": pool}, WarmstartConfig(datasets=["nq"], per_dataset=100, seed=3))
    assert len(chosen) == 30 and all(i.position >= EVAL_SPLIT for i in chosen)


@pytest.mark.parametrize("recipe", ["protocol", "reading"])
def test_two_search_trajectories_are_oversampled_on_request(tokenizer, recipe):
    one = to_example(tokenizer, _item(), [FIRST])
    two = to_example(tokenizer, _item(position=151), [FIRST, SECOND])
    config = WarmstartConfig(recipe=recipe, heldout=0, two_search_repeat=1)
    assert sorted(len(g) for g in split_heldout([one, two], config)[0]) == [1, 1]
    groups, _ = split_heldout([one, two], config.model_copy(update={"two_search_repeat": 3}))
    assert sorted(g[0].id for g in groups) == ["q150", "q151", "q151", "q151"]


def test_a_cached_example_set_is_used_only_for_the_same_draw(tmp_path, tokenizer):
    pool = [_item(dataset="hotpotqa", position=p) for p in (150, 151, 152)]
    cache = tmp_path / "examples.jsonl"
    assert cached_examples(cache, {"hotpotqa": pool}, pool[:2]) == []  # nothing kept yet
    kept = [to_example(tokenizer, item, [FIRST]) for item in pool[:2]]
    cache.write_text("".join(e.model_dump_json() + "\n" for e in kept))
    assert cached_examples(cache, {"hotpotqa": pool}, pool[:2]) == kept
    # another draw (more questions, or another dataset's): built anew, not silently reused
    assert cached_examples(cache, {"hotpotqa": pool}, pool) == []
    # a resumed run's own examples (its config checked equal): a drawn question that gave no example is no other draw
    assert cached_examples(cache, {"hotpotqa": pool}, pool, same_config=True) == kept
    # ...but a question it did not draw still is
    assert cached_examples(cache, {"hotpotqa": pool}, [pool[0], pool[2]], same_config=True) == []
    # a kept question that is not in the training pool (e.g. from the evaluation split) is refused
    with pytest.raises(SplitViolation, match="not training-pool questions"):
        cached_examples(cache, {"hotpotqa": pool[1:]}, pool[1:])


def test_an_adapters_order_is_recomputed_from_its_manifest_and_its_held_out_kept():
    from services.trainer.warmstart.sft import question_key, training_order
    from services.trainer.warmstart.stages import adapter_seen

    examples = [
        SFTExample(id=f"q{i}", dataset="nq", input_ids=[1, 2, 3], loss_mask=[0, 1, 1], kind="reading", variant=0,
                   searches=["q"], answer="a", answer_shown=True)
        for i in range(40)
    ]  # fmt: skip
    config = WarmstartConfig(heldout=5, seed=3)
    groups, heldout = split_heldout(examples, config)
    order = training_order(groups, 1.0, config.seed)
    manifest = {
        "config": config.model_dump(),
        "data": {"trained_ids": {"nq": [g[0].id for g in groups]}, "heldout_ids": [question_key(e) for e in heldout]},
        "training": {"examples_seen": 12},
    }
    assert adapter_seen(manifest, config) == [question_key(e) for e in order[:12]]
    manifest["data"]["heldout_ids"] = manifest["data"]["heldout_ids"][1:] + ["nq:q-other"]
    with pytest.raises(ValueError, match="another draw"):
        adapter_seen(manifest, config)

    # rebuilt elsewhere, one question it did not see yet is now too long: its held-out questions are kept the same
    long_id = order[20].id
    rebuilt = [e.model_copy(update={"input_ids": [1] * 5000}) if e.id == long_id else e for e in examples]
    keep = [question_key(e) for e in heldout]
    groups2, heldout2 = split_heldout(rebuilt, config, heldout_keys=keep)
    assert [question_key(e) for e in heldout2] == keep and len(groups2) == 34
    # a held-out question with no example in this build stays out of training and out of the held-out loss
    groups3, heldout3 = split_heldout(rebuilt, config, heldout_keys=[*keep, f"nq:{long_id}"])
    assert [question_key(e) for e in heldout3] == keep and len(groups3) == 34
    assert long_id not in {g[0].id for g in groups3}

    # the questions it saw open the continued order, once each; the rest follow
    first = [question_key(e) for e in order[:12]]
    continued = training_order(groups2, 1.0, config.seed, first=first)
    keys = [question_key(e) for e in continued]
    assert keys[:12] == first and len(keys) == len(set(keys)) == 34


def test_a_run_that_repeats_its_two_search_variants_continues_from_its_adapter():
    from services.trainer.warmstart.sft import question_key, training_order
    from services.trainer.warmstart.stages import adapter_seen

    examples = [
        SFTExample(id=f"q{i}", dataset="hotpotqa", input_ids=[1, 2, 3], loss_mask=[0, 1, 1], kind="reading",
                   variant=v, searches=["a", "b"] if i % 2 and v else ["a"], answer="x", answer_shown=True)
        for i in range(20) for v in range(2)
    ]  # fmt: skip
    config = WarmstartConfig(heldout=4, seed=1, two_search_repeat=3)
    groups, heldout = split_heldout(examples, config)
    two_search = sum(1 for g in groups[:16] for e in g if len(e.searches) > 1)
    assert two_search > 0 and len(groups) == 16 + 2 * two_search  # each two-search variant twice more
    order = training_order(groups, 1.0, config.seed)
    seen = [question_key(e) for e in order[:20]]
    assert len(set(seen)) < len(seen)  # a question visited more than once in the first epoch
    manifest = {"config": config.model_dump(), "data": {"seen": seen}, "training": {"examples_seen": 20}}
    assert adapter_seen(manifest, config) == seen
    # continued: what it saw opens the epoch, then exactly the visits it had not made yet
    continued = training_order(groups, 1.0, config.seed, first=seen)
    assert [question_key(e) for e in continued[:20]] == seen
    assert sorted(map(question_key, continued)) == sorted(map(question_key, order))
    # a question listed more often than an epoch visits it: past the first epoch, refused
    with pytest.raises(ValueError, match="past its first epoch"):
        training_order(groups, 1.0, config.seed, first=[*seen, "hotpotqa:q1", "hotpotqa:q1", "hotpotqa:q1"])
    # without repeats, any repeat is a second epoch, refused from the manifest alone
    plain = {**manifest, "config": WarmstartConfig(heldout=4, seed=1).model_dump()}
    with pytest.raises(ValueError, match="past its first epoch"):
        adapter_seen(plain, config)
