"""Wire models for the checkpoint endpoints both services share."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from services.common.checkpoints import Manifest

# pending: its document collection is not built yet (a new document tower: built when it is activated);
# embedding: the corpus is being re-embedded for it; ready: it can serve; failed: the re-embed failed (see `error`).
CheckpointState = Literal["pending", "embedding", "ready", "failed"]


class CheckpointInfo(BaseModel):
    version: str
    kind: str
    parent: str | None = None
    created_at: str | None = None
    state: CheckpointState = Field("ready", description="Whether the checkpoint can serve; see CheckpointState.")
    error: str | None = Field(None, description="Why the re-embed failed, when state is 'failed'.")


class CheckpointList(BaseModel):
    active: str
    previous: str | None
    checkpoints: list[CheckpointInfo]
    pending: str | None = Field(None, description="A version being prepared (e.g. a corpus re-embed).")


class RegisterCheckpointRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    path: str = Field(min_length=1, max_length=4_096, description="A folder under the checkpoint root.")
    strict_lineage: bool = Field(
        False,
        description="Refuse a checkpoint whose parent version is not registered here. Off by default: lineage is "
        "metadata, and a checkpoint from another deployment is still a valid checkpoint.",
    )


class RegisteredCheckpoint(Manifest):
    """`POST /v1/checkpoints`: the verified manifest, and what this deployment knows of its lineage."""

    parent_known: bool = Field(True, description="False: the parent version is not registered here.")
    notes: list[str] = Field(default_factory=list, description="What registering it here implied, in words.")


class ActivationResponse(BaseModel):
    active: str
    previous: str | None
    pending: str | None = None
    status: str = Field(description="'active', or 'reindexing' while a new document tower embeds the corpus.")
    replicas: dict[str, str] | None = Field(
        None, description="In a replica group: each replica's report on this swap (committed, failed: why, ...)."
    )
