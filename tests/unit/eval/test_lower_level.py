"""The lower-level experiment's data: training questions only from the training pools, evaluation rows only from
the evaluation split, both with supporting passages."""

from __future__ import annotations

import json
import math

import pytest

from experiments.lower_level import eval_rows, train_questions
from services.data.split import EVAL_SPLIT


def write(qa_dir, dataset: str, n: int, supported=lambda i: True) -> None:
    rows = [{"id": f"{dataset}-{i}", "question": f"Q{i}?", "golden_answers": ["a"],
             "metadata": {"supporting_doc_ids": [f"d{i}"] if supported(i) else []}} for i in range(n)]  # fmt: skip
    (qa_dir / f"{dataset}.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")


def test_training_questions_come_from_the_pools_interleaved_and_evaluation_from_the_split(tmp_path):
    write(tmp_path, "a", EVAL_SPLIT + 6, supported=lambda i: i % 2 == 0)
    write(tmp_path, "b", EVAL_SPLIT + 3)
    picked = train_questions(tmp_path, ["a", "b"], 100, seed=0)
    positions = [int(r["id"].split("-")[1]) for r in picked]
    assert len(picked) == 3 + 3 and all(p >= EVAL_SPLIT for p in positions)  # a's 3 supported + b's 3
    assert [r["id"][0] for r in picked[:4]] == ["a", "b", "a", "b"]  # the datasets interleaved
    assert train_questions(tmp_path, ["a", "b"], 100, seed=0) == picked  # seeded
    evals = eval_rows(tmp_path)
    assert len(evals["a"]) == EVAL_SPLIT // 2 and len(evals["b"]) == EVAL_SPLIT
    assert all(int(r["id"].split("-")[1]) < EVAL_SPLIT for rows in evals.values() for r in rows)


def scored(gold: list[bool], student: float, teacher: float, posterior: float, lps: list[float]) -> dict:
    return {"gold": gold, "answer_logprobs": lps, "log_prior": [-0.7, -0.7], "mass/student": student,
            "mass/teacher": teacher, "mass/posterior": posterior, "top_gold/student": student > 0.5,
            "top_gold/teacher": teacher > 0.5, "top_gold/posterior": posterior > 0.5}  # fmt: skip


def test_teacher_quality_counts_only_questions_that_can_tell_and_compares_gold_mass_per_question():
    from experiments.teacher_quality import summarise

    rows = [scored([True, False], 0.6, 0.4, 0.7, [-1.0, -3.0]),
            scored([False, True], 0.3, 0.2, 0.5, [-2.0, -2.5]),
            scored([False, False], 0.0, 0.0, 0.0, [-1.0, -1.0]),  # no gold among the candidates
            scored([True, True], 1.0, 1.0, 1.0, [-1.0, -1.0])]  # fmt: skip  # only gold
    summary = summarise(rows)
    assert (summary["questions"], summary["informative"]) == (4, 2)
    assert (summary["no_gold_in_candidates"], summary["all_gold"]) == (1, 1)
    assert summary["student"]["gold_mass"] == pytest.approx(0.45)
    assert summary["teacher"]["gold_mass"] == pytest.approx(0.30)
    assert summary["teacher"]["vs_student"] == {"more_gold": 0, "less_gold": 2, "p": 0.5}
    assert summary["posterior"]["vs_student"]["more_gold"] == 2
    assert summary["student"]["top_is_gold"] == 0.5
    assert summary["answer_logprob_gap_gold_minus_other"] == (2.0 - 0.5) / 2  # gold minus other, per question
    by_beta = summary["posterior_by_beta_q"]  # a flat prior: the posterior is the policy's softmax at beta_Q
    assert by_beta["1.0"] == pytest.approx((math.exp(-1) / (math.exp(-1) + math.exp(-3)) + 1 / (1 + math.exp(0.5))) / 2)
    assert by_beta["0.25"] > by_beta["4.0"]  # the sharper policy puts more on the first question's gold


def test_teacher_quality_judged_by_the_candidates_that_hold_the_answer():
    """A multi-hop question's bridge passage is supporting without holding y*: the answer-bearing view scores the
    three distributions by the candidates that hold a gold alias, from the stored log-probs."""
    from experiments.teacher_quality import answer_view, holds_answer

    docs = {"bridge": ("Brand (play)", "A play by Henrik Ibsen."), "hop": ("Henrik Ibsen", "Born in Skien, Norway."),
            "other": ("Skien", "A city in Telemark.")}  # fmt: skip
    assert holds_answer(["bridge", "hop", "other", "missing"], ["Norway"], docs) == [False, True, False, False]
    flat = [math.log(0.5), math.log(0.5)]
    rows = [
        {**scored([True, True], 1.0, 1.0, 1.0, [-5.0, -1.0]), "log_prior": flat, "holds_answer": [False, True]},
        {**scored([True, False], 1.0, 1.0, 1.0, [-1.0, -1.0]), "log_prior": flat, "holds_answer": [True, True]},
    ]  # the second tells nothing: both candidates hold y*
    view = answer_view(rows, beta_q=1.0)
    assert view["informative"] == 1
    assert view["student"]["answer_mass"] == pytest.approx(0.5) and view["student"]["top_holds_answer"] == 0.0
    assert view["teacher"]["answer_mass"] == pytest.approx(1 / (1 + math.exp(-4.0)))
    assert view["teacher"]["top_holds_answer"] == 1.0
    assert view["teacher"]["vs_student"] == {"more": 1, "less": 0, "p": 1.0}


def test_teacher_quality_splits_top_gold_by_where_the_answer_is_written():
    """A y*-scored teacher can single out a supporting passage by reading only where one holds y*: the view splits
    top-gold by that and gives the ceiling of a perfect reader (top-gold there, chance or its own top elsewhere)."""
    from experiments.teacher_quality import evidence_case, evidence_view
    from services.common.answers import label_answer

    reads = {**scored([True, False], 0.6, 0.9, 0.8, [-1.0, -3.0]), "holds_answer": [True, False]}
    misled = {**scored([True, False], 0.6, 0.1, 0.4, [-3.0, -1.0]), "holds_answer": [False, True]}
    bridge = {**scored([True, False, False, False], 0.7, 0.2, 0.6, [-2.0] * 4), "holds_answer": [False] * 4}
    guessed = {**scored([True, True, False, False], 0.7, 0.6, 0.6, [-2.0] * 4), "holds_answer": [False] * 4}
    compared = {**scored([True, False], 0.9, 0.4, 0.9, [-1.0, -1.0]), "holds_answer": [False] * 2, "yes_no": True}
    cases = [evidence_case(s) for s in (reads, misled, compared, bridge)]
    assert cases == ["supporting_holds_answer", "only_other_holds_answer", "yes_no_answer", "no_candidate_holds_answer"]
    assert label_answer([" Yes"]) and not label_answer(["Norway"])
    view = evidence_view([reads, misled, bridge, guessed, compared])
    readable = view["supporting_holds_answer"]
    assert readable["posterior_vs_student"] == {"more_gold": 1, "less_gold": 0, "p": 1.0}
    assert readable | {"posterior_vs_student": None} == {"questions": 1, "chance": 0.5, "student": 1.0, "teacher": 1.0,
                                                         "posterior": 1.0, "posterior_vs_student": None}  # fmt: skip
    assert view["only_other_holds_answer"]["teacher"] == 0.0
    none = view["no_candidate_holds_answer"]
    assert none["questions"] == 2 and none["chance"] == pytest.approx((0.25 + 0.5) / 2) and none["teacher"] == 0.5
    assert view["yes_no_answer"]["questions"] == 1 and view["yes_no_answer"]["teacher"] == 0.0
    assert view["perfect_reader_top_is_gold"] == pytest.approx((1.0 + 0.5 + 0.25 + 0.5 + 1.0) / 5)
    assert view["perfect_reader_else_teacher"] == pytest.approx((1.0 + 0.0 + 0.0 + 1.0 + 1.0) / 5)


def test_training_questions_leave_out_what_an_adapter_trained_on(tmp_path):
    write(tmp_path, "a", EVAL_SPLIT + 4)
    picked = train_questions(tmp_path, ["a"], 100, seed=0, exclude={"a": {f"a-{EVAL_SPLIT}", f"a-{EVAL_SPLIT + 2}"}})
    assert sorted(r["id"] for r in picked) == [f"a-{EVAL_SPLIT + 1}", f"a-{EVAL_SPLIT + 3}"]


def test_teacher_quality_held_out_of_every_stage_of_the_named_adapters():
    from services.modeling.shipped import SHIPPED_ADAPTERS, verify_adapter
    from services.trainer.warmstart.adapter import shipped_trained_ids

    data = verify_adapter(SHIPPED_ADAPTERS["reading"])["data"]
    seen = shipped_trained_ids(["reading"])
    for key in ("trained_ids", "earlier_trained_ids"):
        for dataset, ids in (data.get(key) or {}).items():
            assert set(ids) <= seen[dataset]
    both = shipped_trained_ids(["reading", "protocol"])
    assert all(seen[d] <= both[d] for d in seen) and sum(map(len, both.values())) > sum(map(len, seen.values()))


def test_teacher_quality_update_by_where_the_answer_is_written():
    """The posterior target's pull on the retriever, per case: no pull where the policy scores every candidate
    alike (total variation 0), and a pull towards the y*-holding candidate where it reads."""
    from experiments.teacher_quality import update_view

    flat = [math.log(0.5), math.log(0.5)]
    reads = {**scored([True, False], 0.5, 0.9, 0.9, [-1.0, -3.0]), "log_prior": flat, "holds_answer": [True, False]}
    blind = {**scored([True, False], 0.5, 0.5, 0.5, [-2.0, -2.0]), "log_prior": flat, "holds_answer": [False, False]}
    view = update_view([reads, blind], beta_q=1.0)
    pulled = view["supporting_holds_answer"]
    moved = 1 / (1 + math.exp(-2.0)) - 0.5
    assert pulled["questions"] == 1 and pulled["total_variation"] == pytest.approx(moved)
    assert pulled["gold_mass_change"]["mean"] == pytest.approx(moved) and pulled["gold_mass_change"]["more"] == 1
    assert pulled["answer_mass_change"]["more"] == 1
    none = view["no_candidate_holds_answer"]
    assert none["questions"] == 1 and none["total_variation"] == pytest.approx(0.0)
    assert none["gold_mass_change"]["more"] == none["gold_mass_change"]["less"] == 0
    assert view["yes_no_answer"] == {"questions": 0}
