from __future__ import annotations

from fastapi import APIRouter, Request, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from services.retriever.routes.deps import Metrics, Service

router = APIRouter()


@router.get("/healthz")
async def healthz() -> dict:
    return {"status": "ok"}


@router.get("/readyz")
async def readyz(service: Service) -> dict:
    count = service.document_count()  # touches the index
    return {"status": "ready", "retriever_version": service.active.version, "documents": count}


@router.get("/metrics")
async def metrics(request: Request, service: Service, metrics: Metrics) -> Response:
    metrics.documents.set(service.document_count())
    metrics.active_version.clear()
    metrics.active_version.labels(service.active.version).set(1)
    return Response(generate_latest(metrics.registry), media_type=CONTENT_TYPE_LATEST)
