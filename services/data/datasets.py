"""The benchmarks `bridge-rl eval` knows, their groups, and how their question files are read."""

from __future__ import annotations

import json
from pathlib import Path

from pydantic import BaseModel, Field

GROUPS: dict[str, tuple[str, ...]] = {
    "general": ("nq", "triviaqa", "popqa"),
    "multi-hop": ("hotpotqa", "2wikimultihopqa", "musique", "bamboogle"),
    "medical": ("pubmedqa", "medqa", "medmcqa", "bioasq"),
}
GROUP_OF = {dataset: group for group, members in GROUPS.items() for dataset in members}


class EvalItem(BaseModel):
    """One question in the FlashRAG / Search-R1 layout, with what scoring needs pulled out of `metadata`."""

    id: str
    dataset: str
    question: str
    golden_answers: list[str] = Field(min_length=1)
    choice: tuple[str, str] | None = Field(None, description="Multiple choice: (gold letter, gold option text).")
    supporting_doc_ids: list[str] = Field(default_factory=list)


def row_fields(row: dict, dataset: str) -> dict:
    """The EvalItem fields of one question-file row (evaluation and the warm start read rows the same way)."""
    meta = row.get("metadata") or {}
    options, letter = meta.get("options"), meta.get("answer_idx")
    return {
        "id": str(row["id"]),
        "dataset": row.get("dataset") or dataset,
        "question": row["question"],
        "golden_answers": [str(a) for a in row["golden_answers"]],
        "choice": (letter, options[letter]) if options and letter in options else None,
        "supporting_doc_ids": [str(d) for d in meta.get("supporting_doc_ids") or []],
    }


def question_file(qa_dir: Path, dataset: str) -> Path:
    for name in (f"{dataset}.jsonl", f"{dataset}_questions.jsonl"):
        if (qa_dir / name).exists():
            return qa_dir / name
    raise FileNotFoundError(f"no questions for dataset {dataset!r} in {qa_dir}")


def is_question_file(path: Path) -> bool:
    """Whether the first row of a .jsonl file is a question (a corpus of {id, title, text} passages, such as
    services/demo_data/hotpotqa_corpus.jsonl, is not one)."""
    with path.open() as fh:
        for line in fh:
            if line.strip():
                try:
                    row = json.loads(line)
                except ValueError:
                    return False
                return isinstance(row, dict) and "question" in row and "golden_answers" in row
    return False


def available(qa_dir: Path) -> list[str]:
    """Datasets with a question file in `qa_dir`, in group order, then any others by name (a training-only
    `<dataset>_train.jsonl` is not one: evaluation never reads it; nor is a corpus file beside them)."""
    names = {
        p.name.removesuffix(".jsonl").removesuffix("_questions")
        for p in qa_dir.glob("*.jsonl")
        if not p.name.endswith("_train.jsonl") and is_question_file(p)
    }
    known = [d for members in GROUPS.values() for d in members if d in names]
    return known + sorted(names - set(known))


def resolve(qa_dir: Path, spec: str) -> list[str]:
    """`all`, a group name, or comma-separated dataset names."""
    if spec == "all":
        return available(qa_dir)
    if spec in GROUPS:
        return [d for d in GROUPS[spec] if d in available(qa_dir)]
    names = [s.strip() for s in spec.split(",") if s.strip()]
    for name in names:
        question_file(qa_dir, name)  # fail before any request when one is missing
    return names


def load_items(qa_dir: Path, dataset: str, limit: int | None) -> list[EvalItem]:
    """The first `limit` questions of the file: a fixed split (the shipped files are already shuffled)."""
    items = []
    with question_file(qa_dir, dataset).open() as fh:
        for line in fh:
            if not line.strip():
                continue
            items.append(EvalItem.model_validate(row_fields(json.loads(line), dataset)))
            if limit is not None and len(items) >= limit:
                break
    return items


def items_from_rows(rows: list[dict], spec: str, limit: int | None) -> dict[str, list[EvalItem]]:
    """`load_items` for rows read from a data path (services/data/files.py): per dataset they hold (`spec`:
    `all`, a group or comma-separated names, as `resolve`), its first `limit` rows in file order."""
    by_dataset: dict[str, list[dict]] = {}
    for row in rows:
        by_dataset.setdefault(row["dataset"], []).append(row)
    known = [d for members in GROUPS.values() for d in members if d in by_dataset]
    present = known + sorted(set(by_dataset) - set(known))
    if spec == "all":
        names = present
    elif spec in GROUPS:
        names = [d for d in GROUPS[spec] if d in by_dataset]
    else:
        names = [s.strip() for s in spec.split(",") if s.strip()]
        missing = [d for d in names if d not in by_dataset]
        if missing:
            raise ValueError(f"no questions of {', '.join(missing)} in the data (it holds {', '.join(present)})")
    return {d: [EvalItem.model_validate(row_fields(r, d)) for r in by_dataset[d][:limit]] for d in names}
