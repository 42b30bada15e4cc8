"""`bridge-rl ingest FILE.jsonl`: stream a corpus into the retriever service in batches.

Documents are keyed by id and the service skips unchanged ones, so a re-run after an interruption
finishes the job without duplicates and without re-embedding what is already in.
"""

from __future__ import annotations

from pathlib import Path

from tqdm import tqdm

from services.common.clients.retriever import RetrieverClient
from services.common.corpus import count_lines, read_documents
from services.common.schemas.retriever import Document


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
