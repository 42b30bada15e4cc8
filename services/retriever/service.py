"""Retriever logic: search (greedy or sampled), documents, and checkpoint hot swap. No FastAPI here.

The serving pair (query encoder, document collection) lives in one immutable `ActiveRetriever`; a search leases
the active version from the checkpoint registry (`services.common.registry`, with `registry.EncoderLoader`) when
it starts, so it finishes on the version it started with. A new document tower's collection is built by
`reindex.ReindexJob` before its version serves.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

from services.common.errors import Conflict, InvalidRequest, NotFound, NotReady
from services.common.registry import CheckpointRegistry
from services.common.replicas import ReplicaConfig, ReplicaGroup
from services.common.schemas.checkpoints import ActivationResponse, RegisteredCheckpoint
from services.common.schemas.retriever import (
    Candidate,
    DeleteDocumentResponse,
    Document,
    DocumentLookupResponse,
    ScoredDoc,
    SearchRequest,
    SearchResponse,
    SearchResult,
    UpsertDocumentsResponse,
)
from services.modeling.plackett_luce import gumbel_top_k, plackett_luce_logprob, query_rng
from services.retriever.backends.batcher import MicroBatcher
from services.retriever.backends.index import EdgeIndex, Hit, QdrantClientIndex, VectorIndex
from services.retriever.document_log import DocumentLog, DocumentWrite
from services.retriever.registry import ActiveRetriever, EncoderLoader, RegistryState
from services.retriever.reindex import ReindexJob, passage_text
from services.retriever.settings import RetrieverSettings

log = logging.getLogger(__name__)


def content_hash(doc: Document) -> str:
    return hashlib.sha256(f"{doc.title}\x00{doc.text}".encode()).hexdigest()[:16]


def build_index(settings: RetrieverSettings) -> VectorIndex:
    backend = settings.resolved_backend
    if backend == "qdrant-server":
        if not settings.qdrant_url:
            raise ValueError("index backend qdrant-server needs QDRANT_URL")
        return QdrantClientIndex(url=settings.qdrant_url, hnsw_ef=settings.hnsw_ef)
    if backend == "qdrant-local":
        return QdrantClientIndex(path=settings.state_dir / "qdrant-local", hnsw_ef=settings.hnsw_ef)
    return EdgeIndex(settings.state_dir / "qdrant-edge", hnsw_ef=settings.hnsw_ef)


class RetrieverService:
    def __init__(
        self,
        settings: RetrieverSettings,
        index: VectorIndex | None = None,
        on_batch: Callable[[int], None] | None = None,
    ) -> None:
        """`on_batch(n)`: told each micro-batch's query count (the app's `bridge_retriever_batch_queries`)."""
        self.settings = settings
        settings.state_dir.mkdir(parents=True, exist_ok=True)
        self.index = index or build_index(settings)
        base_dir = Path(settings.encoder_dir) if settings.encoder_dir else settings.retriever_model_dir
        if not (base_dir / "config.json").exists():
            raise FileNotFoundError(f"no encoder at {base_dir}: run `bridge-rl prepare` first")
        self.reindex = ReindexJob(self.index, settings.encode_batch_size)
        self.checkpoints: CheckpointRegistry[ActiveRetriever] = CheckpointRegistry(
            EncoderLoader(settings, self.index, base_dir, self.reindex),
            RegistryState,
            settings.state_dir / "registry.json",
            settings.checkpoint_root,
            keep_pinned=settings.pinned_versions,
        )
        self.group = self._replica_group(settings)
        self.documents = self._document_log(settings)
        self._search_pool = ThreadPoolExecutor(1, thread_name_prefix="search")
        self._write_pool = ThreadPoolExecutor(1, thread_name_prefix="write")
        self._batcher = MicroBatcher(self._search_batch, self._search_pool, wait_s=settings.batch_wait_ms / 1000,
                                     max_wait_s=settings.batch_max_wait_ms / 1000, on_batch=on_batch)  # fmt: skip

    def _replica_group(self, settings: RetrieverSettings) -> ReplicaGroup | None:
        if settings.replica_group is None:
            return None
        if not settings.redis_url:
            raise ValueError("BRIDGE_RETRIEVER_REPLICA_GROUP needs REDIS_URL: the replicas swap through Redis")
        import socket

        config = ReplicaConfig(group=settings.replica_group, lag_bound_s=settings.replica_lag_bound_s,
                               replica_id=settings.replica_id or f"{socket.gethostname()}:{settings.port}")  # fmt: skip
        return ReplicaGroup(settings.resolved_redis_url, config, self.checkpoints)

    def _document_log(self, settings: RetrieverSettings) -> DocumentLog | None:
        """Replicas with their own embedded index share their document writes (a Qdrant server is one index)."""
        if self.group is None or settings.resolved_backend == "qdrant-server":
            return None
        return DocumentLog(settings.resolved_redis_url, self.group.config.group, self.group.config.replica_id,
                           settings.state_dir, self._apply_write, lag_bound_s=settings.replica_lag_bound_s)  # fmt: skip

    # ---------------------------------------------------------------- lifecycle
    async def start(self) -> None:
        await self.checkpoints.restore(previous=False)
        if self.documents is not None:  # every write the group has taken, before this replica says it is ready
            await self.documents.start()
        if self.group is not None:  # on the group's version before this replica says it is ready
            await self.group.start()
        self._batcher.start()

    async def stop(self) -> None:
        if self.documents is not None:
            await self.documents.stop()
        if self.group is not None:
            await self.group.stop()
        await self._batcher.stop()
        await self.checkpoints.close(timeout=60)
        self._search_pool.shutdown(wait=True)
        self._write_pool.shutdown(wait=True)
        self.index.close()

    @property
    def active(self) -> ActiveRetriever:
        """The serving pair new requests get."""
        return self.checkpoints.weights(self.checkpoints.active)

    def _pending(self) -> ActiveRetriever | None:
        """The serving pair of a version whose collection is being built (documents written now go there too)."""
        pending = self.checkpoints.pending
        return None if pending is None else self.checkpoints.weights(pending)

    # ---------------------------------------------------------------- search
    def _search_batch(self, active: ActiveRetriever, items: list[tuple[str, int, bool]]) -> list[list[Hit]]:
        """(query, limit, exact) items: one encoder forward for all, one index call per kind of search."""
        queries = [q for q, _, _ in items]
        vectors = active.query_encoder.encode(queries, batch_size=self.settings.encode_batch_size, kind="query")
        hits: list[list[Hit]] = [[] for _ in items]
        for exact in (False, True):
            rows = [n for n, item in enumerate(items) if item[2] is exact]
            if rows:
                found = self.index.search(active.collection, vectors[rows], max(items[n][1] for n in rows), exact)
                for n, row_hits in zip(rows, found, strict=True):
                    hits[n] = row_hits[: items[n][1]]
        return hits

    async def check_in_rotation(self) -> None:
        """In a replica group, a replica behind the group's version takes no unpinned request (a 503 the load
        balancer retries at another replica), so nothing is answered at an older version than the group's."""
        if self.group is not None:
            serving, why = await self.group.in_rotation()
            if not serving:
                raise NotReady(f"out of rotation: {why}", code="replica_lagging")
        if self.documents is not None and self.documents.failing:
            raise NotReady(f"out of rotation: {self.documents.failing}", code="replica_lagging")

    async def search(self, request: SearchRequest) -> SearchResponse:
        chars, bound = sum(map(len, request.queries)), self.settings.max_query_chars_per_request
        if chars > bound:  # one search thread serves everyone: no request may hold it for long
            raise InvalidRequest(f"the queries hold {chars} characters; this deployment takes at most {bound} a "
                                 "request (BRIDGE_RETRIEVER_MAX_QUERY_CHARS_PER_REQUEST): split them",
                                 param="queries", code="too_much_work")  # fmt: skip
        if request.version is None:
            await self.check_in_rotation()
        if request.version is not None and request.version not in self.checkpoints.table.checkpoints:
            raise Conflict(f"retriever version {request.version!r} is not registered here", param="version",
                           code="version_not_registered")  # fmt: skip
        async with self.checkpoints.lease(request.version) as version:  # every query of this request: one version
            active = self.checkpoints.weights(version)
            limit = request.candidates
            hits = await self._batcher.submit(active, [(q, limit, request.exact) for q in request.queries])
        results = [
            self._select(query, query_hits, request, position)
            for position, (query, query_hits) in enumerate(zip(request.queries, hits, strict=True))
        ]
        return SearchResponse(retriever_version=active.version, results=results)

    @staticmethod
    def _select(query: str, hits: list[Hit], request: SearchRequest, position: int) -> SearchResult:
        candidates = [Candidate(id=h.doc_id, score=h.score) for h in hits]
        k = min(request.top_k, len(hits))
        logprob = None
        if request.mode == "sample" and hits:
            logits = np.array([h.score for h in hits], dtype=np.float64) / request.temperature
            chosen = gumbel_top_k(logits, k, query_rng(request.seed, position))
            logprob = plackett_luce_logprob(logits, chosen)
        else:
            chosen = list(range(k))
        docs = [
            ScoredDoc(
                id=hits[i].doc_id,
                title=hits[i].payload.get("title", ""),
                text=hits[i].payload["text"],
                score=hits[i].score,
            )
            for i in chosen
        ]
        return SearchResult(query=query, docs=docs, candidates=candidates, logprob=logprob)

    # ---------------------------------------------------------------- documents
    async def upsert_documents(self, documents: list[Document]) -> UpsertDocumentsResponse:
        if self.documents is not None:
            write = DocumentWrite(op="upsert", documents=documents, origin=self.documents.replica_id)
            (upserted, unchanged), behind = await self.documents.write(write, self._live_replicas)
            return UpsertDocumentsResponse(upserted=upserted, unchanged=unchanged, replicas_behind=behind)
        upserted, unchanged = await self._run_write(self._upsert_sync, documents)
        return UpsertDocumentsResponse(upserted=upserted, unchanged=unchanged)

    async def _run_write(self, fn: Callable, *args: object) -> object:
        return await asyncio.get_running_loop().run_in_executor(self._write_pool, fn, *args)

    async def _apply_write(self, write: DocumentWrite) -> object:
        """One entry of the group's document log, applied to this replica's index."""
        if write.op == "upsert":
            return await self._run_write(self._upsert_sync, write.documents)
        return await self._run_write(self._delete_sync, write.ids)

    async def _live_replicas(self) -> set[str]:
        assert self.group is not None
        return set(await self.group.members())

    def _upsert_sync(self, documents: list[Document]) -> tuple[int, int]:
        unique = list({d.id: d for d in documents}.values())
        active = self.active
        existing = self.index.retrieve(active.collection, [d.id for d in unique])
        # Re-running an interrupted ingest costs a lookup, not a forward pass, for what is already in.
        changed = [d for d in unique if existing.get(d.id, {}).get("hash") != content_hash(d)]
        targets = [(active.collection, active.doc_encoder)]
        pending = self._pending()
        if pending is not None:
            targets.append((pending.collection, pending.doc_encoder))
        if changed:
            payloads = [{"doc_id": d.id, "title": d.title, "text": d.text, "hash": content_hash(d)} for d in changed]
            texts = [passage_text(d.title, d.text) for d in changed]
            for collection, encoder in targets:
                vectors = encoder.encode(texts, batch_size=self.settings.encode_batch_size, kind="passage")
                self.index.upsert(collection, vectors, payloads)
        return len(changed), len(unique) - len(changed)

    async def get_document(self, doc_id: str) -> Document:
        found = self.index.retrieve(self.active.collection, [doc_id])
        if doc_id not in found:
            raise NotFound(f"no document with id {doc_id!r}", param="id")
        payload = found[doc_id]
        return Document(id=doc_id, title=payload.get("title", ""), text=payload["text"])

    async def lookup_documents(self, ids: list[str]) -> DocumentLookupResponse:
        wanted = list(dict.fromkeys(ids))
        found = self.index.retrieve(self.active.collection, wanted)
        documents = [
            Document(id=i, title=found[i].get("title", ""), text=found[i]["text"]) for i in wanted if i in found
        ]
        return DocumentLookupResponse(documents=documents, missing=[i for i in wanted if i not in found])

    async def delete_document(self, doc_id: str) -> DeleteDocumentResponse:
        await self.get_document(doc_id)
        if self.documents is not None:
            write = DocumentWrite(op="delete", ids=[doc_id], origin=self.documents.replica_id)
            _, behind = await self.documents.write(write, self._live_replicas)
            return DeleteDocumentResponse(deleted=doc_id, replicas_behind=behind)
        await self._run_write(self._delete_sync, [doc_id])
        return DeleteDocumentResponse(deleted=doc_id)

    def _delete_sync(self, doc_ids: list[str]) -> None:
        collections = {self.active.collection}
        pending = self._pending()
        if pending is not None:
            collections.add(pending.collection)
        for collection in collections:
            self.index.delete(collection, doc_ids)

    def document_count(self) -> int:
        return self.index.count(self.active.collection)

    # ---------------------------------------------------------------- checkpoints
    async def register(self, path: str, strict_lineage: bool = False) -> RegisteredCheckpoint:
        """A parent this deployment has never seen is metadata, not an error (unless `strict_lineage`): a query-only
        checkpoint then embeds with the base document tower, and the response says so."""
        if self.group is not None:
            manifest = await self.group.register(path, strict_lineage=strict_lineage)
        else:
            manifest = await self.checkpoints.register(path, strict_lineage=strict_lineage)
        parent_known = manifest.parent is None or manifest.parent in self.checkpoints.table.checkpoints
        notes = [] if parent_known else [
            f"parent version {manifest.parent} is not registered here: kept as lineage metadata"
            + ("" if manifest.kind == "retriever-full" else "; queries are searched in the base document index")
        ]  # fmt: skip
        return RegisteredCheckpoint(**manifest.model_dump(), parent_known=parent_known, notes=notes)

    async def activate(self, version: str) -> ActivationResponse:
        """In a replica group: every replica prepares `version`, then all commit it (services/common/replicas.py)."""
        if self.group is not None:
            return await self.group.activate(version)
        return await self.checkpoints.activate(version)

    async def rollback(self) -> ActivationResponse:
        if self.group is not None:
            return await self.group.rollback()
        return await self.checkpoints.rollback()
