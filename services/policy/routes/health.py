from __future__ import annotations

from fastapi import APIRouter, Response

from services.common.schemas.policy import ServingConfig
from services.policy.routes.deps import Metrics, Service

router = APIRouter()


@router.get("/readyz")
async def readyz(service: Service) -> dict:
    await service.store.ping()  # touches Redis; the engine is up once the service exists
    return {"status": "ready", "policy_version": service.checkpoints.active, "engine": service.settings.engine,
            "engine_healthy": await service.engine.healthy(),
            **({"fallback": f} if (f := service.checkpoints.fallback) else {})}  # fmt: skip


@router.get("/metrics")
async def metrics(service: Service, metrics: Metrics) -> Response:
    return metrics.exposition(service.checkpoints.active, service.checkpoints.fallback)


@router.get("/v1/serving", response_model=ServingConfig)
async def serving(service: Service) -> ServingConfig:
    """How served queries decode and retrieve; the trainer checks it before a live run."""
    s = service.settings
    return ServingConfig(temperature=s.serve_temperature, retrieval=s.serve_retrieval,
                         retrieval_share=s.serve_retrieval_share, retrieval_candidates=s.serve_retrieval_candidates,
                         retrieval_temperature=s.serve_retrieval_temperature)  # fmt: skip
