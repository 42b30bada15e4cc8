"""The split rule in one place: training reads the pool (after the first EVAL_SPLIT questions of a benchmark file,
or all of a `<dataset>_train.jsonl`), evaluation never reads a `_train` file, and trained ids are refused."""

from __future__ import annotations

import json

import pytest

from services.data.datasets import available
from services.data.split import EVAL_SPLIT, SplitViolation, refuse_trained_questions, training_data, training_rows
from services.trainer.algo.config import AlgoConfig
from services.trainer.rollout import round_items
from services.trainer.round_files import pool_questions
from services.trainer.run_state import RunConfig
from services.trainer.settings import TrainerSettings


def _write(path, ids):
    path.write_text("".join(json.dumps({"id": i, "question": f"{i}?", "golden_answers": ["a"]}) + "\n" for i in ids))


def test_training_reads_only_the_pool(tmp_path):
    _write(tmp_path / "nq.jsonl", [f"q{i}" for i in range(EVAL_SPLIT + 30)])
    rows = training_rows(tmp_path, "nq")
    assert [p for p, _ in rows] == list(range(EVAL_SPLIT, EVAL_SPLIT + 30))
    assert [r["id"] for _, r in rows] == [f"q{i}" for i in range(EVAL_SPLIT, EVAL_SPLIT + 30)]
    _write(tmp_path / "nq_train.jsonl", ["t0", "t1"])  # a training-only file wins, whole
    assert [r["id"] for _, r in training_rows(tmp_path, "nq")] == ["t0", "t1"]
    _write(tmp_path / "popqa.jsonl", [f"p{i}" for i in range(EVAL_SPLIT)])
    with pytest.raises(SplitViolation, match="all in the evaluation split"):
        training_rows(tmp_path, "popqa")
    with pytest.raises(FileNotFoundError, match="no training questions"):
        training_rows(tmp_path, "musique")
    assert available(tmp_path) == ["nq", "popqa"]  # nq_train.jsonl is not an evaluation dataset


def test_a_training_run_never_samples_the_evaluation_split(tmp_path):
    _write(tmp_path / "hotpotqa.jsonl", [f"q{i}" for i in range(EVAL_SPLIT + 12)])
    settings = TrainerSettings(data_dir=tmp_path / "data", qa_dir=tmp_path)
    pool = pool_questions(settings, "hotpotqa")
    config = RunConfig(run_id="r", dataset="hotpotqa", rounds=20, questions_per_round=8, algo=AlgoConfig(seed=1))
    asked = {row["id"] for r in range(20) for row in round_items(config, pool, r)}
    assert asked and asked <= {f"q{i}" for i in range(EVAL_SPLIT, EVAL_SPLIT + 12)}
    assert round_items(config, pool, 3) == round_items(config, pool, 3)  # a resumed round asks the same


def test_a_data_path_to_our_file_trains_on_the_same_pool(tmp_path):
    """`bridge-rl train --data <qa_dir>/nq.jsonl` trains on exactly what `--dataset nq` does."""
    _write(tmp_path / "nq.jsonl", [f"q{i}" for i in range(EVAL_SPLIT + 7)])
    pool = [row["id"] for _, row in training_rows(tmp_path, "nq")]
    assert [row["id"] for row in training_data(tmp_path / "nq.jsonl", tmp_path).rows] == pool
    assert [row["id"] for row in training_data(tmp_path, tmp_path).rows] == pool


def test_evaluation_refuses_what_the_adapter_trained_on():
    manifest = {"data": {"trained_ids": {"nq": ["q120", "q121"]}}}
    with pytest.raises(SplitViolation, match="trained on"):
        refuse_trained_questions([("nq", "q5"), ("nq", "q121")], manifest)
    refuse_trained_questions([("nq", "q5"), ("popqa", "q121")], manifest)  # other dataset, other question
