"""Corpus files: JSONL, one passage a line, in either layout:

* ours (FlashRAG's): `{"id", "title", "text"}`;
* Search-R1's wiki-18: `{"id", "contents"}`, where `contents` is the title on its first line (usually in double
  quotes) and the passage after it: `{"id": "0", "contents": "\"Aaron\"\nAaron is a prophet..."}`.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

from services.common.schemas.retriever import Document


def split_contents(contents: str) -> tuple[str, str]:
    """(title, text) of a Search-R1 `contents` string; one pair of quotes around the title is dropped. A single
    line is a passage without a title."""
    title, newline, text = contents.partition("\n")
    if not newline:
        return "", contents
    title = title.strip()
    if len(title) >= 2 and title[0] == title[-1] == '"':
        title = title[1:-1]
    return title, text


def document_from_row(row: dict) -> Document:
    if "text" not in row and "contents" in row:
        title, text = split_contents(row["contents"])
        return Document(id=str(row["id"]), title=title, text=text)
    return Document(id=str(row["id"]), title=row.get("title") or "", text=row["text"])


def read_documents(path: Path) -> Iterator[Document]:
    with path.open() as fh:
        for line_no, line in enumerate(fh, 1):
            if not line.strip():
                continue
            try:
                doc = document_from_row(json.loads(line))
            except (ValueError, KeyError, TypeError, AttributeError) as exc:
                raise ValueError(
                    f"{path}:{line_no}: not a corpus line ({exc!r}; want {{id, title, text}} or {{id, contents}})"
                ) from exc
            yield doc


def count_lines(path: Path) -> int:
    with path.open("rb") as fh:
        return sum(1 for line in fh if line.strip())
