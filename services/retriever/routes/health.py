from __future__ import annotations

from fastapi import APIRouter, Response

from services.retriever.routes.deps import Metrics, Service

router = APIRouter()


@router.get("/readyz")
async def readyz(service: Service) -> dict:
    await service.check_in_rotation()  # a replica behind its group's version: a 503, so the balancer drains it
    count = service.document_count()  # touches the index
    fallback = service.checkpoints.fallback  # start could not load the recorded active version
    return {"status": "ready", "retriever_version": service.active.version, "documents": count,
            **({"fallback": fallback} if fallback else {})}  # fmt: skip


@router.get("/metrics")
async def metrics(service: Service, metrics: Metrics) -> Response:
    metrics.documents.set(service.document_count())
    return metrics.exposition(service.active.version, service.checkpoints.fallback)
