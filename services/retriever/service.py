"""Retriever logic: search (greedy or sampled), documents, and checkpoint hot swap. No FastAPI here.

The serving pair (query encoder, document collection) lives in one immutable `ActiveRetriever`; a request
takes a reference to it when it starts, so it finishes on the version it started with, and activation is
one reference assignment.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from services.common.checkpoints import Manifest, load_manifest
from services.common.errors import Conflict, InvalidRequest, NotFound
from services.common.schemas.checkpoints import (
    ActivationResponse,
    CheckpointInfo,
    CheckpointList,
    CheckpointState,
    RegisteredCheckpoint,
)
from services.common.schemas.retriever import (
    Candidate,
    Document,
    DocumentLookupResponse,
    ScoredDoc,
    SearchRequest,
    SearchResponse,
    SearchResult,
)
from services.modeling.encoder import SentenceEncoder
from services.modeling.plackett_luce import gumbel_top_k, plackett_luce_logprob, query_rng
from services.retriever.backends.batcher import MicroBatcher
from services.retriever.backends.index import EdgeIndex, Hit, QdrantClientIndex, VectorIndex
from services.retriever.registry import BASE_VERSION, RegistryState, RetrieverCheckpoint, collection_for
from services.retriever.settings import RetrieverSettings

log = logging.getLogger(__name__)
QUERY_FILE = "query_encoder.safetensors"
DOC_FILE = "doc_encoder.safetensors"


@dataclass(frozen=True)
class ActiveRetriever:
    version: str
    query_encoder: SentenceEncoder
    doc_encoder: SentenceEncoder
    collection: str


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
    def __init__(self, settings: RetrieverSettings, index: VectorIndex | None = None) -> None:
        self.settings = settings
        settings.state_dir.mkdir(parents=True, exist_ok=True)
        self._registry_path = settings.state_dir / "registry.json"
        self.registry = RegistryState.load(self._registry_path)
        for entry in self.registry.checkpoints.values():
            if entry.state == "embedding":  # a re-embed this process's predecessor did not finish
                entry.state = "pending"
        self.index = index or build_index(settings)
        self._base_dir = Path(settings.encoder_dir) if settings.encoder_dir else settings.retriever_model_dir
        if not (self._base_dir / "config.json").exists():
            raise FileNotFoundError(f"no encoder at {self._base_dir}: run `bridge-rl prepare` first")
        self._admin_lock = threading.Lock()  # one checkpoint change at a time
        self._search_pool = ThreadPoolExecutor(1, thread_name_prefix="search")
        self._write_pool = ThreadPoolExecutor(1, thread_name_prefix="write")
        self._loaded: dict[str, tuple[SentenceEncoder, SentenceEncoder]] = {}
        self.pending: str | None = None
        self._reindex_thread: threading.Thread | None = None
        self.active = self._materialise(self.registry.active)
        self.index.create_collection(self.active.collection, self.active.doc_encoder.dim)
        if self.active.collection not in self.registry.complete_collections:
            self.registry.complete_collections.append(self.active.collection)
        self._set_state(self.registry.active, "ready")
        self.registry.save(self._registry_path)
        if self.index.get_alias(settings.alias) != self.active.collection:
            self.index.set_alias(settings.alias, self.active.collection)
        self._batcher = MicroBatcher(self._search_batch, self._search_pool, wait_s=settings.batch_wait_ms / 1000)

    # ---------------------------------------------------------------- lifecycle
    async def start(self) -> None:
        self._batcher.start()

    async def stop(self) -> None:
        await self._batcher.stop()
        if self._reindex_thread is not None:
            self._reindex_thread.join(timeout=60)
        self._search_pool.shutdown(wait=True)
        self._write_pool.shutdown(wait=True)
        self.index.close()

    # ---------------------------------------------------------------- encoders
    def _base_encoder(self) -> SentenceEncoder:
        return SentenceEncoder.from_pretrained(
            self._base_dir, max_length=self.settings.max_length, dtype=self.settings.dtype
        )

    def _encoders(self, version: str) -> tuple[SentenceEncoder, SentenceEncoder]:
        """(query tower, doc tower) for a registered version, loading and verifying files when needed."""
        if version in self._loaded:
            return self._loaded[version]
        entry = self.registry.checkpoints[version]
        if entry.path is None:
            base = self._base_encoder()
            pair = (base, base)
        else:
            folder, manifest = load_manifest(self.settings.checkpoint_root, entry.path)
            pair = self._encoders_from(folder, manifest)
        self._loaded[version] = pair
        return pair

    def _encoders_from(self, folder: Path, manifest: Manifest) -> tuple[SentenceEncoder, SentenceEncoder]:
        if QUERY_FILE not in manifest.files:
            raise InvalidRequest(f"retriever checkpoint needs {QUERY_FILE}", param="path")
        query = self._base_encoder()
        try:
            query.load_weights(folder / QUERY_FILE)
            if manifest.kind == "retriever-full":
                if DOC_FILE not in manifest.files:
                    raise InvalidRequest(f"a retriever-full checkpoint needs {DOC_FILE}", param="path")
                doc = self._base_encoder()
                doc.load_weights(folder / DOC_FILE)
            else:
                doc = self._doc_tower_encoder(manifest.parent)
        except ValueError as exc:
            raise InvalidRequest(str(exc), param="path") from exc
        return query, doc

    def _doc_tower_encoder(self, parent: str | None) -> SentenceEncoder:
        """A query-only checkpoint keeps its parent's document tower."""
        if parent is None or parent not in self.registry.checkpoints:
            return self._encoders(BASE_VERSION)[1]
        return self._encoders(parent)[1]

    def _materialise(self, version: str) -> ActiveRetriever:
        entry = self.registry.checkpoints[version]
        query, doc = self._encoders(version)
        return ActiveRetriever(version, query, doc, collection_for(entry.doc_tower))

    def _trim_loaded(self) -> None:
        keep = {self.registry.active, self.registry.previous, self.pending}
        for version in list(self._loaded):
            if version not in keep:
                del self._loaded[version]

    # ---------------------------------------------------------------- search
    def _search_batch(self, active: ActiveRetriever, items: list[tuple[str, int]]) -> list[list[Hit]]:
        vectors = active.query_encoder.encode([q for q, _ in items], batch_size=self.settings.encode_batch_size)
        limit = max(limit for _, limit in items)
        hits = self.index.search(active.collection, vectors, limit)
        return [h[:lim] for h, (_, lim) in zip(hits, items, strict=True)]

    async def search(self, request: SearchRequest) -> SearchResponse:
        active = self.active  # every query of this request uses this one version
        limit = request.candidates
        hits = await self._batcher.submit(active, [(q, limit) for q in request.queries])
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
    async def upsert_documents(self, documents: list[Document]) -> tuple[int, int]:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._write_pool, self._upsert_sync, documents)

    def _upsert_sync(self, documents: list[Document]) -> tuple[int, int]:
        unique = list({d.id: d for d in documents}.values())
        active = self.active
        existing = self.index.retrieve(active.collection, [d.id for d in unique])
        # Re-running an interrupted ingest costs a lookup, not a forward pass, for what is already in.
        changed = [d for d in unique if existing.get(d.id, {}).get("hash") != content_hash(d)]
        targets = [(active.collection, active.doc_encoder)]
        pending = self.pending
        if pending is not None:
            _, doc_encoder = self._loaded[pending]
            targets.append((collection_for(self.registry.checkpoints[pending].doc_tower), doc_encoder))
        if changed:
            payloads = [{"doc_id": d.id, "title": d.title, "text": d.text, "hash": content_hash(d)} for d in changed]
            texts = [passage_text(d.title, d.text) for d in changed]
            for collection, encoder in targets:
                vectors = encoder.encode(texts, batch_size=self.settings.encode_batch_size)
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

    async def delete_document(self, doc_id: str) -> None:
        await self.get_document(doc_id)
        loop = asyncio.get_running_loop()
        collections = {self.active.collection}
        if self.pending is not None:
            collections.add(collection_for(self.registry.checkpoints[self.pending].doc_tower))
        for collection in collections:
            await loop.run_in_executor(self._write_pool, self.index.delete, collection, [doc_id])

    def document_count(self) -> int:
        return self.index.count(self.active.collection)

    # ---------------------------------------------------------------- checkpoints
    def list_checkpoints(self) -> CheckpointList:
        return CheckpointList(
            active=self.registry.active,
            previous=self.registry.previous,
            pending=self.pending,
            checkpoints=[
                CheckpointInfo.model_validate(c, from_attributes=True) for c in self.registry.checkpoints.values()
            ],
        )

    def register(self, path: str, strict_lineage: bool = False) -> RegisteredCheckpoint:
        """A parent this deployment has never seen is metadata, not an error (unless `strict_lineage`): a query-only
        checkpoint then embeds with the base document tower, and the response says so."""
        folder, manifest = load_manifest(self.settings.checkpoint_root, path)
        parent_known = manifest.parent is None or manifest.parent in self.registry.checkpoints
        notes = [] if parent_known else [
            f"parent version {manifest.parent} is not registered here: kept as lineage metadata"
            + ("" if manifest.kind == "retriever-full" else "; queries are searched in the base document index")
        ]  # fmt: skip
        registered = RegisteredCheckpoint(**manifest.model_dump(), parent_known=parent_known, notes=notes)
        if manifest.kind not in ("retriever-query", "retriever-full"):
            raise InvalidRequest(f"a {manifest.kind} checkpoint is not a retriever checkpoint", param="path")
        with self._admin_lock:
            existing = self.registry.checkpoints.get(manifest.version)
            if existing is not None:
                if existing.path and Path(existing.path) == folder:
                    return registered
                raise Conflict(f"version {manifest.version} is already registered", param="path")
            if not parent_known and strict_lineage:
                raise InvalidRequest(
                    f"parent version {manifest.parent} is not registered (strict lineage was asked)", param="path"
                )
            # Refuse weights that do not load before registering; keep them loaded for the activation.
            pair = self._encoders_from(folder, manifest)
            doc_tower = (
                manifest.version
                if manifest.kind == "retriever-full"
                else self.registry.checkpoints[(manifest.parent if parent_known else None) or BASE_VERSION].doc_tower
            )
            state, error = self._collection_state(doc_tower)
            self.registry.checkpoints[manifest.version] = RetrieverCheckpoint(
                version=manifest.version,
                kind=manifest.kind,
                parent=manifest.parent,
                created_at=manifest.created_at,
                path=str(folder),
                doc_tower=doc_tower,
                state=state,
                error=error,
            )
            self.registry.save(self._registry_path)
            self._loaded[manifest.version] = pair
        return registered

    def activate(self, version: str) -> ActivationResponse:
        with self._admin_lock:
            if version not in self.registry.checkpoints:
                raise NotFound(f"retriever version {version!r} is not registered", param="version")
            entry = self.registry.checkpoints[version]
            if entry.state == "failed":
                raise Conflict(
                    f"retriever version {version} cannot serve: re-embedding the corpus with its document tower "
                    f"failed: {entry.error}",
                    param="version",
                )
            if self.pending is not None:
                raise Conflict(f"version {self.pending} is still re-embedding the corpus; try again later")
            if version == self.registry.active:
                return self._activation_status("active")
            collection = collection_for(self.registry.checkpoints[version].doc_tower)
            if collection == self.active.collection or collection in self.registry.complete_collections:
                self._flip(version)
                return self._activation_status("active")
            self._encoders(version)
            self._set_state(version, "embedding")
            self.registry.save(self._registry_path)
            self.pending = version
            self._reindex_thread = threading.Thread(target=self._reindex, args=(version,), daemon=True)
            self._reindex_thread.start()
            return self._activation_status("reindexing")

    def rollback(self) -> ActivationResponse:
        previous = self.registry.previous
        if previous is None:
            raise Conflict("there is no previous version to roll back to")
        return self.activate(previous)

    def _activation_status(self, status: str) -> ActivationResponse:
        return ActivationResponse(
            active=self.registry.active, previous=self.registry.previous, pending=self.pending, status=status
        )

    def _flip(self, version: str) -> None:
        """Swap the serving pair; callers hold the admin lock."""
        new = self._materialise(version)
        if self.index.get_alias(self.settings.alias) != new.collection:
            self.index.set_alias(self.settings.alias, new.collection)
        previous = self.registry.active
        self.active = new  # the atomic step: requests that start from here on use `new`
        self.registry.previous = previous
        self.registry.active = version
        if new.collection not in self.registry.complete_collections:
            self.registry.complete_collections.append(new.collection)
        self.registry.save(self._registry_path)
        self._trim_loaded()
        log.info("retriever version %s active (previous %s)", version, previous)

    def _collection_state(self, doc_tower: str) -> tuple[CheckpointState, str | None]:
        """The state of a checkpoint served from `doc_tower`'s collection: ready when the collection is built, failed
        (with the reason) when building it failed, else pending."""
        if collection_for(doc_tower) in self.registry.complete_collections:
            return "ready", None
        for entry in self.registry.checkpoints.values():
            if entry.doc_tower == doc_tower and entry.state == "failed":
                return "failed", entry.error
        return "pending", None

    def _set_state(self, version: str, state: CheckpointState, error: str | None = None) -> None:
        """For `version` and every checkpoint that shares its document collection (they share its re-embed); callers
        hold the admin lock (or are the constructor) and save the registry."""
        for entry in self.registry.same_doc_tower(version):
            entry.error = error
            entry.state = state

    def _reindex(self, version: str) -> None:
        """Embed the corpus with a new document tower into a new collection, then flip alias and encoder.

        On failure the active version is unchanged and the checkpoint's state is 'failed' with the reason."""
        target = collection_for(self.registry.checkpoints[version].doc_tower)
        try:
            self._embed_corpus(version, target)
            with self._admin_lock:
                self.registry.complete_collections.append(target)
                self._set_state(version, "ready")
                self._flip(version)
        except Exception as exc:
            if self.active.collection == target:  # it went live; only recording that failed
                log.exception("retriever version %s is active, but saving the registry failed", version)
                return
            log.exception("re-embedding for retriever version %s failed; the active version is unchanged", version)
            with self._admin_lock:
                if target in self.registry.complete_collections:
                    self.registry.complete_collections.remove(target)
                self._set_state(version, "failed", f"{type(exc).__name__}: {exc}"[:2000])
                self.registry.save(self._registry_path)
            try:  # free what the half-built collection holds; nothing serves from it
                if self.index.collection_exists(target):
                    self.index.drop_collection(target)
            except Exception:
                log.exception("could not drop the half-built collection %s", target)
        finally:
            self.pending = None

    def _embed_corpus(self, version: str, target: str) -> None:
        _, doc_encoder = self._loaded[version]
        if self.index.collection_exists(target):
            self.index.drop_collection(target)  # a half-built collection from an interrupted run
        self.index.create_collection(target, doc_encoder.dim)
        for payloads in self.index.scroll(self.active.collection, batch=256):
            texts = [passage_text(p.get("title", ""), p["text"]) for p in payloads]
            vectors = doc_encoder.encode(texts, batch_size=self.settings.encode_batch_size)
            if not np.isfinite(vectors).all():  # the index would take them, and never find those passages
                bad = int((~np.isfinite(vectors).all(axis=1)).sum())
                raise ReembedFailed(f"the document tower gave non-finite vectors for {bad} of {len(texts)} passages")
            self.index.upsert(target, vectors, payloads)
        self.index.optimize(target)

    def wait_reindexed(self, timeout: float | None = None) -> None:
        if self._reindex_thread is not None:
            self._reindex_thread.join(timeout)


class ReembedFailed(RuntimeError):
    """Re-embedding the corpus with a new document tower cannot finish (the reason is recorded on the checkpoint)."""


def passage_text(title: str, text: str) -> str:
    return f"{title}\n{text}" if title else text
