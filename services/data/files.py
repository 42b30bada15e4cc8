"""Questions from a user's own files: a Search-R1 / verl parquet file, a FlashRAG (or our) jsonl file, or a folder
of them, read into the row dicts the rest of the code uses (`id`, `question`, `golden_answers`, `dataset`,
`metadata`; `services/data/datasets.py` `row_fields` reads them).

Search-R1's `scripts/data_process/nq_search.py` (PeterGriffinJin/Search-R1) writes one parquet row per question:
`data_source`, `prompt` (chat messages; the user message is an instruction, then `Question: {question}\\n`),
`ability`, `reward_model` (`{"style": "rule", "ground_truth": {"target": [answers]}}`) and `extra_info`
(`{"split", "index"}`). The question is what follows the last `Question:` marker of the user message (the whole
message when there is none), the answers are `ground_truth.target`, the dataset is `data_source` and the id is
`<split>_<index>` (FlashRAG's own id for that question), else the row number.

A bad row (no question, no answers, not JSON, a repeated id) is skipped with a one-line reason naming its row:
jsonl rows by their line number (from 1, as an editor shows them), parquet rows by their index (from 0, as
`pandas.read_parquet(path).iloc[i]`). Nothing is dropped silently: `DataRows.skipped` holds every one.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

SUFFIXES = (".parquet", ".jsonl")
QUESTION_MARKER = "Question:"
SPLIT_NAMES = {"train", "dev", "test", "val", "valid", "validation"}
# The parquet columns read (any that a file lacks are left out): Search-R1's, and FlashRAG's flat ones.
PARQUET_COLUMNS = ("data_source", "prompt", "reward_model", "extra_info", "id", "question", "golden_answers",
                   "dataset", "metadata")  # fmt: skip


class DataFileError(ValueError):
    """A data path that cannot give questions: missing, unreadable, of an unknown format, or with no usable row.
    The message is one line, fit for a command-line error."""


class BadRow(ValueError):
    """A row that cannot be a question: `kind` is the short reason counted in the summary, `detail` the rest."""

    def __init__(self, kind: str, detail: str = "") -> None:
        super().__init__(f"{kind} ({detail})" if detail else kind)
        self.kind, self.detail = kind, detail


@dataclass(frozen=True)
class SkippedRow:
    file: Path
    row: str  # "line 7" (jsonl) or "row 6" (parquet)
    kind: str  # "no question", "no answers", "not JSON", "not a JSON object", "repeated id"
    detail: str = ""

    def __str__(self) -> str:
        return f"{self.file}: {self.row}: {self.kind}" + (f" ({self.detail})" if self.detail else "")


@dataclass
class DataRows:
    """What a data path gave: the rows, every row skipped and why, the files read, and (training) how many rows
    of our benchmark files were left out as their evaluation split."""

    rows: list[dict] = field(default_factory=list)
    skipped: list[SkippedRow] = field(default_factory=list)
    files: list[Path] = field(default_factory=list)
    held_out: int = 0
    notes: list[str] = field(default_factory=list)

    def summary(self) -> str:
        per_dataset = ", ".join(f"{d} {n}" for d, n in Counter(row["dataset"] for row in self.rows).items())
        noun = "question" if len(self.rows) == 1 else "questions"
        text = f"{len(self.rows)} {noun} ({per_dataset or 'none'}) from {len(self.files)} file(s)"
        if self.held_out:
            text += f"; {self.held_out} left out as the evaluation split"
        if self.skipped:
            reasons = Counter(s.kind for s in self.skipped)
            text += f"; skipped {len(self.skipped)} row(s): " + ", ".join(f"{r} {n}" for r, n in reasons.items())
        return text

    def report(self, limit: int = 10) -> list[str]:
        """The lines to show: notes, the first `limit` skipped rows (one line each), then the summary."""
        lines = [*self.notes, *(f"skipped {s}" for s in self.skipped[:limit])]
        if len(self.skipped) > limit:
            lines.append(f"... and {len(self.skipped) - limit} more skipped row(s)")
        return [*lines, self.summary()]


def search_r1_question(content: str) -> str:
    """The question inside a Search-R1 prompt (`... Question: {question}\\n`): what follows the last `Question:`
    marker, stripped (a RAG prompt's trailing ` Context: ...` cut off); the whole text when there is no marker."""
    _, marker, tail = content.rpartition(QUESTION_MARKER)
    question = tail if marker else content
    return question.split(" Context: ", 1)[0].strip()


def dataset_name(path: Path) -> str:
    """The dataset a file's rows belong to when they do not say: `nq.jsonl`, `nq_train.jsonl` and
    `nq_questions.jsonl` are nq; a file named for a split (`nq/train.jsonl`, FlashRAG's layout) is its folder's."""
    stem = path.stem.removesuffix("_train").removesuffix("_questions")
    return path.parent.name if path.stem.lower() in SPLIT_NAMES and path.parent.name else stem


def data_files(path: Path) -> list[Path]:
    """The files a data path names: the file itself, or a folder's .parquet and .jsonl files (not its subfolders),
    by name."""
    if not path.exists():
        raise DataFileError(f"{path}: no such file or folder")
    if path.is_dir():
        try:
            files = sorted(p for p in path.iterdir() if p.is_file() and p.suffix in SUFFIXES)
        except OSError as exc:
            raise DataFileError(f"{path}: cannot be listed ({exc.strerror or exc})") from exc
        if not files:
            raise DataFileError(f"{path}: no .parquet or .jsonl files in this folder")
        return files
    if path.suffix not in SUFFIXES:
        raise DataFileError(f"{path}: not a .parquet or .jsonl file")
    return [path]


def _answers(value: Any) -> list[str]:
    """Gold answers as strings: a list, a numpy array (pandas reads parquet lists so) or a single string."""
    if value is None:
        return []
    if isinstance(value, str):
        value = [value]
    elif hasattr(value, "tolist"):
        value = value.tolist()
    if not isinstance(value, list | tuple):
        value = [value]
    return [text for text in (str(a).strip() for a in value if a is not None) if text]


def _user_content(prompt: Any) -> str | None:
    if isinstance(prompt, str):
        return prompt
    if hasattr(prompt, "tolist"):
        prompt = prompt.tolist()
    if not isinstance(prompt, list | tuple):
        return None
    for message in prompt:
        if isinstance(message, dict) and message.get("role") == "user" and isinstance(message.get("content"), str):
            return message["content"]
    return None


def parquet_row(row: dict, position: int, default_dataset: str) -> dict:
    """One Search-R1 / verl parquet row as a question row (flat FlashRAG columns where the Search-R1 ones are
    missing); BadRow when it has no question or no answers."""
    content = _user_content(row.get("prompt"))
    question = search_r1_question(content) if content is not None else str(row.get("question") or "").strip()
    if not question:
        raise BadRow("no question", "" if content is not None else "no user message in prompt")
    target = ((row.get("reward_model") or {}).get("ground_truth") or {}).get("target")
    answers = _answers(target if target is not None else row.get("golden_answers"))
    if not answers:
        raise BadRow("no answers", "reward_model.ground_truth.target is missing or empty")
    extra = row.get("extra_info") or {}
    if extra.get("index") is not None:
        qid = f"{extra['split']}_{extra['index']}" if extra.get("split") else str(extra["index"])
    else:
        qid = str(row["id"]) if row.get("id") is not None else str(position)
    return {
        "id": qid,
        "question": question,
        "golden_answers": answers,
        "dataset": str(row.get("data_source") or row.get("dataset") or default_dataset),
        "metadata": row.get("metadata") if isinstance(row.get("metadata"), dict) else {},
    }


def jsonl_row(row: Any, position: int, default_dataset: str) -> dict:
    """One FlashRAG / our jsonl row (`id`, `question`, `golden_answers`, optional `dataset` and `metadata`) as a
    question row; BadRow when it has no question or no answers."""
    if not isinstance(row, dict):
        raise BadRow("not a JSON object", type(row).__name__)
    question = row.get("question")
    if not isinstance(question, str) or not question.strip():
        raise BadRow("no question")
    answers = _answers(row.get("golden_answers"))
    if not answers:
        raise BadRow("no answers", "golden_answers is missing or empty")
    return {
        "id": str(row["id"]) if row.get("id") is not None else str(position),
        "question": question.strip(),
        "golden_answers": answers,
        "dataset": str(row.get("dataset") or default_dataset),
        "metadata": row.get("metadata") if isinstance(row.get("metadata"), dict) else {},
    }


Rows = Iterator[tuple[int, str, dict | BadRow]]


def _jsonl_rows(path: Path) -> Rows:
    """(position among non-blank rows, "line N", the row or why it is bad) of each non-blank line."""
    default = dataset_name(path)
    position = 0
    with path.open(encoding="utf-8") as fh:
        for number, line in enumerate(fh, start=1):
            if not line.strip():
                continue
            try:
                yield position, f"line {number}", jsonl_row(json.loads(line), position, default)
            except json.JSONDecodeError as exc:
                yield position, f"line {number}", BadRow("not JSON", f"{exc.msg} at column {exc.colno}")
            except BadRow as exc:
                yield position, f"line {number}", exc
            position += 1


def _parquet_rows(path: Path) -> Rows:
    import pyarrow.parquet as pq

    default = dataset_name(path)
    parquet = pq.ParquetFile(path)
    columns = [c for c in PARQUET_COLUMNS if c in parquet.schema_arrow.names]
    position = 0
    for batch in parquet.iter_batches(batch_size=4096, columns=columns):
        for row in batch.to_pylist():
            try:
                yield position, f"row {position}", parquet_row(row, position, default)
            except BadRow as exc:
                yield position, f"row {position}", exc
            position += 1


def file_rows(path: Path) -> Rows:
    """Every non-blank row of one file: (position, where, the row or a BadRow); DataFileError when the file
    cannot be read at all."""
    import pyarrow as pa

    try:
        yield from (_parquet_rows if path.suffix == ".parquet" else _jsonl_rows)(path)
    except (OSError, UnicodeDecodeError, pa.ArrowException) as exc:
        raise DataFileError(f"{path}: cannot be read as {path.suffix[1:]} ({str(exc).splitlines()[0]})") from exc


def is_question_data(path: Path) -> bool:
    """Whether a file holds questions: a parquet file with a prompt or question column; a jsonl file unless its
    first row is an object with neither question nor golden_answers (a corpus of passages). A first row that is
    bad otherwise does not say: it is counted as a bad row with the others."""
    if path.suffix == ".parquet":
        import pyarrow as pa
        import pyarrow.parquet as pq

        try:
            names = pq.read_schema(path).names
        except (OSError, pa.ArrowException) as exc:
            raise DataFileError(f"{path}: cannot be read as parquet ({str(exc).splitlines()[0]})") from exc
        return "prompt" in names or "question" in names
    try:
        with path.open(encoding="utf-8") as fh:
            first = next((line for line in fh if line.strip()), None)
    except (OSError, UnicodeDecodeError) as exc:
        raise DataFileError(f"{path}: cannot be read as jsonl ({exc})") from exc
    try:
        row = json.loads(first) if first is not None else None
    except json.JSONDecodeError:
        return True
    return not isinstance(row, dict) or "question" in row or "golden_answers" in row


def read_data(path: Path, start_of: Callable[[Path], int | str] | None = None) -> DataRows:
    """The questions of a file or a folder of them. `start_of(file)` is the position of a file's first row to
    read (rows before it are counted in `held_out`), or why the file is left out; default: every row.

    A folder's files that hold no questions (a corpus beside them) are left out with a note; a file named on
    its own that holds none is a DataFileError. A row whose (dataset, id) came before is skipped as a repeat."""
    files = data_files(path)
    result = DataRows()
    seen: dict[tuple[str, str], str] = {}
    for file in files:
        if not is_question_data(file):
            if not path.is_dir():
                raise DataFileError(f"{file}: not a question file (its first row has no question or golden_answers)")
            result.notes.append(f"left out {file}: not a question file")
            continue
        start = start_of(file) if start_of else 0
        if isinstance(start, str):
            if not path.is_dir():
                raise DataFileError(f"{file}: {start}")
            result.notes.append(f"left out {file}: {start}")
            continue
        result.files.append(file)
        for position, where, row in file_rows(file):
            if position < start:
                result.held_out += 1
                continue
            if isinstance(row, dict):
                key = (row["dataset"], row["id"])
                if key in seen:
                    row = BadRow("repeated id", f"{key[1]!r} of dataset {key[0]!r}, first at {seen[key]}")
                else:
                    seen[key] = f"{file.name} {where}"
            if isinstance(row, BadRow):
                result.skipped.append(SkippedRow(file, where, row.kind, row.detail))
            else:
                result.rows.append(row)
    if not result.rows:
        reason = f"; skipped {len(result.skipped)} row(s), first: {result.skipped[0]}" if result.skipped else ""
        held = f"; {result.held_out} row(s) are evaluation-split questions" if result.held_out else ""
        raise DataFileError(f"{path}: no usable questions{held}{reason}")
    return result
