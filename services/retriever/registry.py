"""The retriever's side of the checkpoint registry (`services.common.registry`): its table, with the document
collection each checkpoint serves from, and `EncoderLoader`, which loads a version's (query tower, document tower).

A query-only checkpoint keeps the document tower (and so the collection) of the version it descends from; a
retriever-full checkpoint brings its own document tower, whose collection `reindex.ReindexJob` builds when it is
first activated."""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from pathlib import Path

from pydantic import Field, model_validator

from services.common.checkpoints import Manifest
from services.common.errors import InvalidRequest
from services.common.registry import BASE_VERSION, CheckpointEntry, CheckpointRegistry, VersionTable, WeightsLoader
from services.common.schemas.checkpoints import CheckpointState
from services.modeling.encoder import SentenceEncoder
from services.retriever.backends.index import VectorIndex
from services.retriever.reindex import ReindexJob
from services.retriever.settings import RetrieverSettings

log = logging.getLogger(__name__)
QUERY_FILE = "query_encoder.safetensors"
DOC_FILE = "doc_encoder.safetensors"


class RetrieverCheckpoint(CheckpointEntry):
    doc_tower: str = Field(description="Version whose document tower embedded this checkpoint's collection.")
    state: CheckpointState = Field("ready", description="Of its document collection: pending/embedding/ready/failed.")
    error: str | None = Field(None, description="Why the re-embed failed (state 'failed').")


class RegistryState(VersionTable):
    checkpoints: dict[str, RetrieverCheckpoint] = Field(default_factory=dict)
    complete_collections: list[str] = Field(
        default_factory=list, description="Collections whose embedding pass finished."
    )

    @model_validator(mode="after")
    def _derive_states(self) -> RegistryState:
        """A registry written before states were recorded: a checkpoint is ready when its collection was built."""
        for entry in self.checkpoints.values():
            if "state" not in entry.model_fields_set:
                entry.state = "ready" if collection_for(entry.doc_tower) in self.complete_collections else "pending"
        return self

    def same_doc_tower(self, version: str) -> list[RetrieverCheckpoint]:
        """Every checkpoint served from `version`'s document collection (it, and query-only children)."""
        doc_tower = self.checkpoints[version].doc_tower
        return [c for c in self.checkpoints.values() if c.doc_tower == doc_tower]

    def sharing(self, version: str) -> list[RetrieverCheckpoint]:
        return self.same_doc_tower(version)  # they share its re-embed

    @classmethod
    def fresh(cls) -> RegistryState:
        state = cls()
        state.checkpoints[BASE_VERSION] = RetrieverCheckpoint(
            version=BASE_VERSION, kind="retriever-base", doc_tower=BASE_VERSION, state="ready"
        )
        return state

    def collection_state(self, doc_tower: str) -> tuple[CheckpointState, str | None]:
        """The state of a checkpoint served from `doc_tower`'s collection: ready when the collection is built, failed
        (with the reason) when building it failed, else pending."""
        if collection_for(doc_tower) in self.complete_collections:
            return "ready", None
        for entry in self.checkpoints.values():
            if entry.doc_tower == doc_tower and entry.state == "failed":
                return "failed", entry.error
        return "pending", None


def collection_for(doc_tower: str) -> str:
    return f"docs-{doc_tower}"


@dataclass(frozen=True)
class ActiveRetriever:
    """A version's serving pair; a request takes it when it starts and finishes on it."""

    version: str
    query_encoder: SentenceEncoder
    doc_encoder: SentenceEncoder
    collection: str


class EncoderLoader(WeightsLoader[ActiveRetriever]):
    noun = "retriever"
    kinds = ("retriever-query", "retriever-full")
    keep_registered = True  # activating it is what comes next
    preparing_status = "reindexing"
    preparing = "re-embedding the corpus"
    preparation_failed = "re-embedding the corpus with its document tower failed"

    def __init__(self, settings: RetrieverSettings, index: VectorIndex, base_dir: Path, reindex: ReindexJob) -> None:
        self.settings = settings
        self.index = index
        self.base_dir = base_dir
        self.reindex = reindex

    def entry_for(
        self, registry: CheckpointRegistry[ActiveRetriever], folder: Path, manifest: Manifest, *, strict_lineage: bool
    ) -> RetrieverCheckpoint:
        table: RegistryState = registry.table  # type: ignore[assignment]
        parent_known = manifest.parent is None or manifest.parent in table.checkpoints
        if not parent_known and strict_lineage:
            raise InvalidRequest(
                f"parent version {manifest.parent} is not registered (strict lineage was asked)", param="path"
            )
        doc_tower = (
            manifest.version
            if manifest.kind == "retriever-full"
            else table.checkpoints[(manifest.parent if parent_known else None) or BASE_VERSION].doc_tower
        )
        state, error = table.collection_state(doc_tower)
        entry = super().entry_for(registry, folder, manifest, strict_lineage=strict_lineage)
        return RetrieverCheckpoint(**entry.model_dump(exclude={"state", "error"}), doc_tower=doc_tower, state=state,
                                   error=error)  # fmt: skip

    def base_encoder(self) -> SentenceEncoder:
        """The base model, with the folder's encoder preset under the BRIDGE_ENCODER_* settings (both towers)."""
        return SentenceEncoder.from_pretrained(
            self.base_dir, max_length=self.settings.max_length, dtype=self.settings.dtype,
            **self.settings.encoder_overrides,
        )  # fmt: skip

    def _tower(self, folder: Path, name: str) -> SentenceEncoder:
        encoder = self.base_encoder()
        try:
            encoder.load_weights(folder / name)
        except ValueError as exc:
            raise InvalidRequest(str(exc), param="path") from exc
        return encoder

    async def load(
        self,
        registry: CheckpointRegistry[ActiveRetriever],
        entry: CheckpointEntry,
        folder: Path | None,
        manifest: Manifest | None,
    ) -> ActiveRetriever:
        assert isinstance(entry, RetrieverCheckpoint)
        collection = collection_for(entry.doc_tower)
        if folder is None or manifest is None:
            base = await asyncio.to_thread(self.base_encoder)
            return ActiveRetriever(entry.version, base, base, collection)
        if QUERY_FILE not in manifest.files:
            raise InvalidRequest(f"retriever checkpoint needs {QUERY_FILE}", param="path")
        query = await asyncio.to_thread(self._tower, folder, QUERY_FILE)
        if manifest.kind == "retriever-full":
            if DOC_FILE not in manifest.files:
                raise InvalidRequest(f"a retriever-full checkpoint needs {DOC_FILE}", param="path")
            doc = await asyncio.to_thread(self._tower, folder, DOC_FILE)
        else:  # a query-only checkpoint keeps the document tower it descends from
            doc = (await registry.load(entry.doc_tower)).doc_encoder
        return ActiveRetriever(entry.version, query, doc, collection)

    def is_ready(self, registry: CheckpointRegistry[ActiveRetriever], version: str) -> bool:
        table: RegistryState = registry.table  # type: ignore[assignment]
        collection = collection_for(table.checkpoints[version].doc_tower)
        return collection == registry.weights(table.active).collection or collection in table.complete_collections

    async def activated(
        self, registry: CheckpointRegistry[ActiveRetriever], version: str, weights: ActiveRetriever
    ) -> None:
        table: RegistryState = registry.table  # type: ignore[assignment]

        def serve() -> None:
            self.index.create_collection(weights.collection, weights.doc_encoder.dim)
            if self.index.get_alias(self.settings.alias) != weights.collection:
                self.index.set_alias(self.settings.alias, weights.collection)

        await asyncio.to_thread(serve)
        if weights.collection not in table.complete_collections:
            table.complete_collections.append(weights.collection)

    async def prepare(
        self, registry: CheckpointRegistry[ActiveRetriever], version: str, weights: ActiveRetriever
    ) -> None:
        source = registry.weights(registry.active).collection
        await asyncio.to_thread(self.reindex.run, version, source, weights.collection, weights.doc_encoder)

    async def abandon(self, registry: CheckpointRegistry[ActiveRetriever], version: str) -> None:
        table: RegistryState = registry.table  # type: ignore[assignment]
        target = collection_for(table.checkpoints[version].doc_tower)
        if target in table.complete_collections:
            table.complete_collections.remove(target)
        await asyncio.to_thread(self.reindex.drop, target)
