from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Path

from services.common.schemas.checkpoints import (
    ActivationResponse,
    CheckpointList,
    RegisterCheckpointRequest,
    RegisteredCheckpoint,
)
from services.retriever.routes.deps import Admin, Service

router = APIRouter(prefix="/v1/checkpoints")
VersionPath = Annotated[str, Path(min_length=1, max_length=128)]


@router.get("", response_model=CheckpointList)
async def list_checkpoints(service: Service) -> CheckpointList:
    return service.checkpoints.listing()


@router.post("", response_model=RegisteredCheckpoint, dependencies=[Admin])
async def register_checkpoint(body: RegisterCheckpointRequest, service: Service) -> RegisteredCheckpoint:
    """A parent version unknown here is registered as lineage metadata (`parent_known: false`, with a note), unless
    `strict_lineage` is asked."""
    return await service.register(body.path, body.strict_lineage)


@router.post("/rollback", response_model=ActivationResponse, dependencies=[Admin])
async def rollback(service: Service) -> ActivationResponse:
    return await service.rollback()


ACTIVATE_ERRORS = {
    404: {"description": "The version is not registered"},
    409: {"description": "Another version is still re-embedding the corpus, or this version's re-embed failed "
          "(the reason in `detail`; its state is 'failed' in GET /v1/checkpoints)"},
}  # fmt: skip


@router.post("/{version}/activate", response_model=ActivationResponse, dependencies=[Admin], responses=ACTIVATE_ERRORS)
async def activate(version: VersionPath, service: Service) -> ActivationResponse:
    return await service.activate(version)
