"""The retriever's checkpoint table, persisted as one JSON file replaced atomically."""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, Field

from services.common.checkpoints import write_json_atomic

BASE_VERSION = "base"


class RetrieverCheckpoint(BaseModel):
    version: str
    kind: str
    parent: str | None = None
    created_at: str | None = None
    path: str | None = Field(None, description="Checkpoint folder; None for the base encoder.")
    doc_tower: str = Field(description="Version whose document tower embedded this checkpoint's collection.")


class RegistryState(BaseModel):
    active: str = BASE_VERSION
    previous: str | None = None
    checkpoints: dict[str, RetrieverCheckpoint] = Field(default_factory=dict)
    complete_collections: list[str] = Field(
        default_factory=list, description="Collections whose embedding pass finished."
    )

    @classmethod
    def load(cls, path: Path) -> RegistryState:
        if path.exists():
            return cls.model_validate_json(path.read_text())
        state = cls()
        state.checkpoints[BASE_VERSION] = RetrieverCheckpoint(
            version=BASE_VERSION, kind="retriever-base", doc_tower=BASE_VERSION
        )
        return state

    def save(self, path: Path) -> None:
        write_json_atomic(path, self.model_dump(mode="json"))


def collection_for(doc_tower: str) -> str:
    return f"docs-{doc_tower}"
