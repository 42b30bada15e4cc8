"""The lower-level experiment's data: training questions only from the training pools, evaluation rows only from
the evaluation split, both with supporting passages."""

from __future__ import annotations

import json

from experiments.lower_level import eval_rows, train_questions
from services.eval.split import EVAL_SPLIT


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
