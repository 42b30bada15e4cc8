"""`bridge-rl ingest FILE.jsonl`: stream a corpus into the retriever service in batches.

Documents are keyed by id and the service skips unchanged ones, so a re-run after an interruption
finishes the job without duplicates and without re-embedding what is already in.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

from tqdm import tqdm

from services.common.clients.retriever import RetrieverClient
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


def ingest_file(client: RetrieverClient, path: Path, batch_size: int = 128, progress: bool = True) -> dict:
    total = count_lines(path)
    upserted = unchanged = 0
    batch: list[Document] = []
    with tqdm(total=total, unit="doc", desc=f"ingest {path.name}", disable=not progress) as bar:
        for doc in read_documents(path):
            batch.append(doc)
            if len(batch) == batch_size:
                result = client.upsert(batch)
                upserted, unchanged = upserted + result.upserted, unchanged + result.unchanged
                bar.update(len(batch))
                batch = []
        if batch:
            result = client.upsert(batch)
            upserted, unchanged = upserted + result.upserted, unchanged + result.unchanged
            bar.update(len(batch))
    return {"file": str(path), "documents": total, "upserted": upserted, "unchanged": unchanged}
