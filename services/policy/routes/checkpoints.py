from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Path

from services.common.checkpoints import Manifest
from services.common.schemas.checkpoints import ActivationResponse, CheckpointList, RegisterCheckpointRequest
from services.policy.routes.deps import Admin, Service

router = APIRouter(prefix="/v1/checkpoints")
VersionPath = Annotated[str, Path(min_length=1, max_length=128)]


@router.get("", response_model=CheckpointList)
async def list_checkpoints(service: Service) -> CheckpointList:
    return service.checkpoints.listing()


@router.post("", response_model=Manifest, dependencies=[Admin])
async def register_checkpoint(body: RegisterCheckpointRequest, service: Service) -> Manifest:
    return await service.checkpoints.register(body.path)


@router.post("/rollback", response_model=ActivationResponse, dependencies=[Admin])
async def rollback(service: Service) -> ActivationResponse:
    return await service.checkpoints.rollback()


@router.post("/{version}/activate", response_model=ActivationResponse, dependencies=[Admin])
async def activate(version: VersionPath, service: Service) -> ActivationResponse:
    return await service.checkpoints.activate(version)
