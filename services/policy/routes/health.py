from __future__ import annotations

from fastapi import APIRouter, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from services.policy.routes.deps import Metrics, Service

router = APIRouter()


@router.get("/healthz")
async def healthz() -> dict:
    return {"status": "ok"}


@router.get("/readyz")
async def readyz(service: Service) -> dict:
    await service.store.ping()  # touches Redis; the engine is up once the service exists
    return {"status": "ready", "policy_version": service.adapters.active, "engine": service.settings.engine,
            "engine_healthy": await service.engine.healthy()}  # fmt: skip


@router.get("/metrics")
async def metrics(service: Service, metrics: Metrics) -> Response:
    metrics.active_version.clear()
    metrics.active_version.labels(service.adapters.active).set(1)
    return Response(generate_latest(metrics.registry), media_type=CONTENT_TYPE_LATEST)
