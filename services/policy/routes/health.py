from __future__ import annotations

from fastapi import APIRouter, Response

from services.policy.routes.deps import Metrics, Service

router = APIRouter()


@router.get("/readyz")
async def readyz(service: Service) -> dict:
    await service.store.ping()  # touches Redis; the engine is up once the service exists
    return {"status": "ready", "policy_version": service.checkpoints.active, "engine": service.settings.engine,
            "engine_healthy": await service.engine.healthy()}  # fmt: skip


@router.get("/metrics")
async def metrics(service: Service, metrics: Metrics) -> Response:
    return metrics.exposition(service.checkpoints.active)
