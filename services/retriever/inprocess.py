"""The retriever service's own code (encoder, index, greedy or sampled top-k) run inside another process, with the
`search(queries, **params) -> SearchResponse` signature of `AsyncRetrieverClient`: the warm start builds its
trajectories over it, so the `<information>` blocks are exactly what serving shows."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from tqdm import tqdm

from services.common.corpus import count_lines, read_documents
from services.common.schemas.retriever import Document, SearchRequest, SearchResponse
from services.retriever.service import RetrieverService
from services.retriever.settings import RetrieverSettings


class InProcessRetriever:
    def __init__(self, data_dir: Path, encoder_dir: Path | None = None) -> None:
        settings = RetrieverSettings(data_dir=data_dir, encoder_dir=str(encoder_dir) if encoder_dir else None)
        self.service = RetrieverService(settings)

    async def __aenter__(self) -> InProcessRetriever:
        await self.service.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.service.stop()

    async def search(self, queries: list[str], **params: Any) -> SearchResponse:
        return await self.service.search(SearchRequest(queries=queries, **params))

    def count(self) -> int:
        return self.service.index.count(self.service.active.collection)

    async def ingest(self, files: Sequence[Path], batch_size: int = 256) -> int:
        """Upsert every passage of `files` (unchanged ones are skipped by content hash, as the service does)."""
        total = sum(count_lines(p) for p in files)
        upserted = 0
        with tqdm(total=total, unit="doc", desc="ingest corpus") as bar:
            for path in files:
                batch: list[Document] = []
                for doc in read_documents(path):
                    batch.append(doc)
                    if len(batch) == batch_size:
                        upserted += (await self.service.upsert_documents(batch)).upserted
                        bar.update(len(batch))
                        batch = []
                if batch:
                    upserted += (await self.service.upsert_documents(batch)).upserted
                    bar.update(len(batch))
        return upserted

    def titles(self, doc_ids: Sequence[str]) -> dict[str, tuple[str, str]]:
        """(title, text) of the stored passages among `doc_ids`."""
        found = self.service.index.retrieve(self.service.active.collection, list(doc_ids))
        return {doc_id: (p.get("title", ""), p.get("text", "")) for doc_id, p in found.items()}
