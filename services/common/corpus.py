"""Corpus files: JSONL, one passage `{id, title, text}` a line (the FlashRAG / Search-R1 layout)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

from services.common.schemas.retriever import Document


def read_documents(path: Path) -> Iterator[Document]:
    with path.open() as fh:
        for line_no, line in enumerate(fh, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
                yield Document(id=str(row["id"]), title=row.get("title") or "", text=row["text"])
            except (ValueError, KeyError) as exc:
                raise ValueError(f"{path}:{line_no}: not a corpus line ({exc})") from exc


def count_lines(path: Path) -> int:
    with path.open("rb") as fh:
        return sum(1 for line in fh if line.strip())
