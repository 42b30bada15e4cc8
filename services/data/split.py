"""The evaluation / training split, in one place: what evaluation reads and what training may read.

In a benchmark file `<dataset>.jsonl` (or `<dataset>_questions.jsonl`) the first `EVAL_SPLIT` questions are the
evaluation split (docs/results.md); the rest of the file is the training pool. A `<dataset>_train.jsonl` file
holds training-pool questions only (what ships in services/demo_data, drawn from the pool). Every trainer reads
questions through `training_rows`, or, given a data path of its own (`bridge-rl train --data`), through
`training_data`, which keeps the same rule for our files wherever they are read from; so no run can sample an
evaluation question.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any, Literal

from services.data.datasets import GROUP_OF, question_file
from services.data.files import DataRows, read_data

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


def training_questions(qa_dir: Path, dataset: str) -> list[dict]:
    """The rows of every training-pool question of `dataset`, in file order."""
    return [row for _, row in training_rows(qa_dir, dataset)]


def own_file(path: Path, qa_dir: Path) -> Literal["benchmark", "train"] | None:
    """Whether a file is one of our question files, whose split holds wherever it is read from: a .jsonl file in
    the QA folder, or one named for a known benchmark anywhere (../shared/data/qa/nq.jsonl). "benchmark": a
    `<dataset>.jsonl` (or any other name), its first EVAL_SPLIT rows the evaluation split; "train": a
    `<dataset>_train.jsonl`, training-pool questions only. None: a user's own file (every row is theirs to use)."""
    if path.suffix != ".jsonl":
        return None
    kind: Literal["benchmark", "train"] = "train" if path.name.endswith("_train.jsonl") else "benchmark"
    dataset = path.name.removesuffix(".jsonl").removesuffix("_train").removesuffix("_questions")
    return kind if dataset in GROUP_OF or path.resolve().parent == qa_dir.resolve() else None


def training_data(path: Path, qa_dir: Path) -> DataRows:
    """Training questions from a data path (`bridge-rl train --data`): every row of a user's own files, and of
    our benchmark files (`own_file`) only the training pool, after their evaluation split."""
    return read_data(path, lambda file: EVAL_SPLIT if own_file(file, qa_dir) == "benchmark" else 0)


def evaluation_data(path: Path, qa_dir: Path) -> DataRows:
    """Evaluation questions from a data path (`bridge-rl eval --data`): every row, never one of our
    training-only `<dataset>_train.jsonl` files."""
    training_only = "a training-only file: evaluation never reads one"
    return read_data(path, lambda file: training_only if own_file(file, qa_dir) == "train" else 0)


def trained_ids(manifest: dict[str, Any]) -> dict[str, set[str]]:
    """Per dataset, the question ids an adapter's manifest lists as trained on, by this stage or an earlier one."""
    data = manifest.get("data", {})
    out: dict[str, set[str]] = {}
    for key in ("trained_ids", "earlier_trained_ids"):
        for dataset, ids in (data.get(key) or {}).items():
            out.setdefault(dataset, set()).update(ids)
    return out


def refuse_trained_questions(items: Iterable[tuple[str, str]], manifest: dict[str, Any]) -> None:
    """Evaluation's side of the split: refuse (dataset, id) pairs that the adapter of `manifest` trained on."""
    seen = trained_ids(manifest)
    bad = [f"{dataset}:{qid}" for dataset, qid in items if qid in seen.get(dataset, ())]
    if bad:
        raise SplitViolation(
            f"{len(bad)} question(s) the warm-start adapter trained on cannot be evaluated: " + ", ".join(bad[:5])
        )
