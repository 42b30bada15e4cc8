"""Evaluation metrics on cases small enough to check by hand."""

from __future__ import annotations

import json

import pytest

from services.common.answers import choice_match
from services.data.datasets import EvalItem, load_items, resolve
from services.eval.scoring import ItemResult, answer_scores, group_means, summarize, support_recall


@pytest.mark.parametrize(
    ("prediction", "expected"),
    [
        ("B", 1.0), ("b", 1.0), ("(B)", 1.0), ("B.", 1.0), ("B) Tell the attending", 1.0),
        ("B. anything at all", 1.0),  # the letter decides when one is named
        ("A", 0.0), ("A. Tell the attending", 0.0),
        ("Tell the attending", 1.0), ("tell the attending.", 1.0),  # the option text, normalised
        ("Report the physician", 0.0), ("", 0.0), (None, 0.0),
    ],
)  # fmt: skip
def test_choice_match_letter_or_option_text(prediction, expected):
    assert choice_match(prediction, "B", "Tell the attending") == expected


def test_choice_match_letter_a_survives_article_removal():
    # SQuAD normalisation drops "a" as an article; the letter is read before it.
    assert choice_match("A", "A", "Aspirin") == 1.0
    assert choice_match("a", "B", "Aspirin") == 0.0
    assert choice_match("Aspirin", "A", "Aspirin") == 1.0


def test_answer_scores_open_and_multiple_choice():
    open_item = EvalItem(id="1", dataset="nq", question="q", golden_answers=["Barack Obama", "Obama"])
    assert answer_scores("obama", open_item) == (1.0, 1.0)
    em, f1 = answer_scores("President Barack Obama", open_item)
    assert em == 0.0 and f1 == pytest.approx(0.8)  # P = 2/3, R = 1 against "barack obama"
    assert answer_scores(None, open_item) == (0.0, 0.0)
    mcq = EvalItem(id="2", dataset="medqa", question="q", golden_answers=["C", "Beta blocker therapy"],
                   choice=("C", "Beta blocker therapy"))  # fmt: skip
    assert answer_scores("C", mcq) == (1.0, 1.0)
    em, f1 = answer_scores("beta blocker", mcq)
    assert em == 0.0 and f1 == pytest.approx(0.8)  # P = 1, R = 2/3
    assert answer_scores("D", mcq)[0] == 0.0


def test_yes_no_f1_only_when_exact():
    item = EvalItem(id="3", dataset="pubmedqa", question="q", golden_answers=["yes"])
    assert answer_scores("yes", item) == (1.0, 1.0)
    assert answer_scores("yes it is", item) == (0.0, 0.0)


def test_support_recall():
    assert support_recall(["d1", "d2", "d3"], ["d1", "d9"]) == 0.5
    assert support_recall(["d1", "d1", "d9"], ["d1", "d9"]) == 1.0
    assert support_recall([], ["d1"]) == 0.0
    assert support_recall(["d1"], []) is None


def _result(dataset: str, mode: str, em: float, recall: float | None, latency: float, **kw) -> ItemResult:
    return ItemResult(dataset=dataset, mode=mode, id=f"{dataset}-{em}-{latency}", question="q", golden_answers=["a"],
                      answer=kw.pop("answer", "x"), em=em, f1=em / 2, recall=recall, retrieved_ids=[],
                      searches=kw.pop("searches", 1), latency_s=latency, **kw)  # fmt: skip


def test_summarize_and_group_means():
    results = [
        _result("nq", "agent", 1.0, 1.0, 1.0),
        _result("nq", "agent", 0.0, 0.0, 3.0, answer=None, searches=2),
        _result("nq", "agent", 0.0, None, 5.0, error="502: engine"),
        _result("popqa", "agent", 1.0, 0.5, 2.0),
        _result("hotpotqa", "direct", 0.0, None, 1.0, searches=0),
    ]
    rows = {(r.dataset, r.mode): r for r in summarize(results)}
    nq = rows[("nq", "agent")]
    assert (nq.n, nq.em, nq.f1, nq.recall, nq.errors) == (3, pytest.approx(1 / 3), pytest.approx(1 / 6), 0.5, 1)
    assert nq.searches == pytest.approx(4 / 3) and nq.answered == pytest.approx(2 / 3)
    assert nq.latency_p50_s == pytest.approx(2.0)  # the errored request's latency is left out
    assert rows[("hotpotqa", "direct")].recall is None and rows[("hotpotqa", "direct")].group == "multi-hop"
    general = next(g for g in group_means(list(rows.values())) if g["group"] == "general")
    assert general["datasets"] == 2 and general["em"] == pytest.approx((1 / 3 + 1.0) / 2)  # macro average


def test_load_items_reads_choices_support_and_limit(tmp_path):
    rows = [
        {"id": "m1", "question": "Q?\nOptions:\nA. x\nB. y", "golden_answers": ["B", "y"], "dataset": "medqa",
         "metadata": {"options": {"A": "x", "B": "y"}, "answer_idx": "B"}},
        {"id": "m2", "question": "Q2", "golden_answers": ["A", "x"], "dataset": "medqa", "metadata": {}},
        {"id": "m3", "question": "Q3", "golden_answers": ["z"]},
    ]  # fmt: skip
    (tmp_path / "medqa.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    (tmp_path / "hotpotqa_questions.jsonl").write_text(json.dumps(
        {"id": "h", "question": "H?", "golden_answers": ["a"], "metadata": {"supporting_doc_ids": ["d1", "d2"]}}
    ) + "\n")  # fmt: skip
    items = load_items(tmp_path, "medqa", limit=2)
    assert [i.id for i in items] == ["m1", "m2"]
    assert items[0].choice == ("B", "y") and items[1].choice is None
    [hotpot] = load_items(tmp_path, "hotpotqa", limit=None)
    assert hotpot.supporting_doc_ids == ["d1", "d2"] and hotpot.dataset == "hotpotqa"
    assert resolve(tmp_path, "all") == ["hotpotqa", "medqa"]  # group order: multi-hop before medical
    assert resolve(tmp_path, "medical") == ["medqa"]
    with pytest.raises(FileNotFoundError):
        resolve(tmp_path, "nq")


def test_cover_match_on_word_boundaries():
    from services.common.answers import cover_match

    assert cover_match("I think it was Barack Obama, in 2008.", ["Barack Obama"]) == 1.0
    assert cover_match("Obamacare", ["Obama"]) == 0.0  # not a word of the text
    assert cover_match("the", ["The"]) == 0.0  # a gold that normalises to nothing never matches
    assert cover_match("", ["x"]) == 0.0 and cover_match(None, ["x"]) == 0.0
    from services.eval.scoring import cover_score

    mcq = EvalItem(id="2", dataset="medqa", question="q", golden_answers=["C", "Beta"], choice=("C", "Beta blocker"))
    assert cover_score("start a beta blocker now", mcq) == 1.0
    assert cover_score("C", mcq) == 0.0  # cover reads option text, not letters


def test_read_results_drops_a_torn_last_line(tmp_path):
    from services.eval.report import read_results

    good = _result("nq", "agent", 1.0, 1.0, 1.0)
    path = tmp_path / "results.jsonl"
    path.write_text(good.model_dump_json() + "\n" + good.model_dump_json()[:40])
    assert read_results(path) == [good]
    assert read_results(tmp_path / "missing.jsonl") == []
