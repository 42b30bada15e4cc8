"""The retriever's checkpoint table, persisted as one JSON file replaced atomically."""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, Field, model_validator

from services.common.checkpoints import write_json_atomic
from services.common.schemas.checkpoints import CheckpointState

BASE_VERSION = "base"


class RetrieverCheckpoint(BaseModel):
    version: str
    kind: str
    parent: str | None = None
    created_at: str | None = None
    path: str | None = Field(None, description="Checkpoint folder; None for the base encoder.")
    doc_tower: str = Field(description="Version whose document tower embedded this checkpoint's collection.")
    state: CheckpointState = Field("ready", description="Of its document collection: pending/embedding/ready/failed.")
    error: str | None = Field(None, description="Why the re-embed failed (state 'failed').")


class RegistryState(BaseModel):
    active: str = BASE_VERSION
    previous: str | None = None
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

    @classmethod
    def load(cls, path: Path) -> RegistryState:
        if path.exists():
            return cls.model_validate_json(path.read_text())
        state = cls()
        state.checkpoints[BASE_VERSION] = RetrieverCheckpoint(
            version=BASE_VERSION, kind="retriever-base", doc_tower=BASE_VERSION, state="ready"
        )
        return state

    def save(self, path: Path) -> None:
        write_json_atomic(path, self.model_dump(mode="json"))


def collection_for(doc_tower: str) -> str:
    return f"docs-{doc_tower}"
