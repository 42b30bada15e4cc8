"""Wire models for the checkpoint endpoints both services share."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class CheckpointInfo(BaseModel):
    version: str
    kind: str
    parent: str | None = None
    created_at: str | None = None


class CheckpointList(BaseModel):
    active: str
    previous: str | None
    checkpoints: list[CheckpointInfo]
    pending: str | None = Field(None, description="A version being prepared (e.g. a corpus re-embed).")


class RegisterCheckpointRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    path: str = Field(min_length=1, max_length=4_096, description="A folder under the checkpoint root.")


class ActivationResponse(BaseModel):
    active: str
    previous: str | None
    pending: str | None = None
    status: str = Field(description="'active', or 'reindexing' while a new document tower embeds the corpus.")
