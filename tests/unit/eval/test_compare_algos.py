"""The comparison script's split, table and plots (the training itself is the trainer's integration test)."""

from __future__ import annotations

import json

import pytest

import experiments.compare_algos as compare
from services.data.split import EVAL_SPLIT, training_rows


def test_split_evaluates_on_the_evaluation_split_and_trains_after_it(tmp_path):
    rows = [{"id": f"q{i}", "question": f"Q{i}?", "golden_answers": ["a"]} for i in range(110)]
    qa = tmp_path / "qa.jsonl"
    qa.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    train_dir, held = compare.split(qa, 3, tmp_path / "out")
    train_ids = [json.loads(line)["id"] for line in (train_dir / "compare_train.jsonl").open()]
    assert train_ids == [f"q{i}" for i in range(EVAL_SPLIT, 110)]  # only the training pool
    assert [r["id"] for _, r in training_rows(train_dir, "compare")] == train_ids  # what a run trains on
    assert [item.id for item in held] == ["q0", "q1", "q2"]  # the file's first lines: its evaluation split
    with pytest.raises(SystemExit, match="evaluation split has only"):
        compare.split(qa, EVAL_SPLIT + 1, tmp_path / "out2")


def test_retrieval_changes_counts_questions_whose_shown_documents_moved():
    base = [{"id": "q1", "retrieved_ids": ["a", "b"]}, {"id": "q2", "retrieved_ids": ["c", "d"]},
            {"id": "q3", "retrieved_ids": ["e", "f"]}]  # fmt: skip
    after = [{"id": "q1", "retrieved_ids": ["a", "b"]}, {"id": "q2", "retrieved_ids": ["d", "c"]},
             {"id": "q3", "retrieved_ids": ["e", "x"]}]  # fmt: skip
    assert compare.retrieval_changes(base, after) == 2  # a new order is a change too: the prompt differs
    assert compare.retrieval_changes(base, base) == 0


def test_table_and_plots(tmp_path):
    row = {"recall/support": 0.5, "time/train_s": 10.0, "memory/peak_mb": 3000.0}
    curves = {a: [{**row, "round": r, "reward/mean": 0.1 * r, "em/mean": 0.1 * r} for r in range(2)]
              for a in ("bridge", "search-r1")}  # fmt: skip
    held = {name: {"em": 0.25, "f1": 0.5, "cover": 0.5, "recall": None if name == "base" else 0.75, "answered": 1.0}
            for name in ("base", "bridge", "search-r1")}  # fmt: skip
    held["bridge"]["retrieval_changed"] = 3
    text = compare.table(held, curves)
    assert "| bridge | 0.250 | 0.500 | 0.500 | 0.750 | 3 | 1.00 | 0.100 | 0.500 | 10 | 3000 |" in text
    assert "| base | 0.250 | 0.500 | 0.500 | – | – | 1.00 | – | – | 0 | 0 |" in text
    paths = compare.plot(tmp_path, curves, held)
    assert {p.name for p in paths} == {"reward_per_round.png", "em_per_round.png", "recall_per_round.png",
                                       "held_out.png"}  # fmt: skip
    assert all(p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" for p in paths)
