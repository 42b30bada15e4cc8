"""The evaluation / training split, in one place: what evaluation reads and what training may read.

In a benchmark file `<dataset>.jsonl` (or `<dataset>_questions.jsonl`) the first `EVAL_SPLIT` questions are the
evaluation split (docs/results.md); the rest of the file is the training pool. A `<dataset>_train.jsonl` file
holds training-pool questions only (what ships in services/demo_data, drawn from the pool). Every trainer reads
questions through `training_rows`, so no run can sample an evaluation question.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from services.eval.datasets import question_file

EVAL_SPLIT = 100


class SplitViolation(ValueError):
    """A question from the wrong side of the split: training on evaluation questions, or evaluating on trained
    ones."""


def training_file(qa_dir: Path, dataset: str) -> tuple[Path, int]:
    """The file training reads for `dataset` and the first line it may use: `<dataset>_train.jsonl` from line
    0, else the benchmark file after its evaluation split."""
    train = qa_dir / f"{dataset}_train.jsonl"
    if train.exists():
        return train, 0
    try:
        return question_file(qa_dir, dataset), EVAL_SPLIT
    except FileNotFoundError as exc:
        raise FileNotFoundError(f"no training questions for dataset {dataset!r} in {qa_dir}") from exc


def training_rows(qa_dir: Path, dataset: str) -> list[tuple[int, dict]]:
    """(line position, row) of every training-pool question of `dataset`."""
    path, start = training_file(qa_dir, dataset)
    with path.open() as fh:
        rows = [json.loads(line) for line in fh if line.strip()]
    if start and len(rows) <= start:
        raise SplitViolation(
            f"{path} has {len(rows)} questions, all in the evaluation split (the first {start}): nothing to train on"
        )
    return list(enumerate(rows))[start:]


def trained_ids(manifest: dict[str, Any]) -> dict[str, set[str]]:
    """Per dataset, the question ids an adapter's manifest (services/policy/warmstart_adapter) lists as trained on."""
    return {dataset: set(ids) for dataset, ids in (manifest.get("data", {}).get("trained_ids") or {}).items()}


def refuse_trained_questions(items: Iterable[tuple[str, str]], manifest: dict[str, Any]) -> None:
    """Evaluation's side of the split: refuse (dataset, id) pairs that the adapter of `manifest` trained on."""
    seen = trained_ids(manifest)
    bad = [f"{dataset}:{qid}" for dataset, qid in items if qid in seen.get(dataset, ())]
    if bad:
        raise SplitViolation(
            f"{len(bad)} question(s) the warm-start adapter trained on cannot be evaluated: " + ", ".join(bad[:5])
        )
