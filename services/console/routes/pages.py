"""The page itself, its health probe, and the console's own liveness."""

from __future__ import annotations

from pathlib import Path

from fastapi import APIRouter
from fastapi.responses import FileResponse

from services.console.protocol import HealthReport
from services.console.routes.deps import Service

STATIC = Path(__file__).resolve().parents[1] / "static"
router = APIRouter()


@router.get("/", include_in_schema=False)
async def index() -> FileResponse:
    return FileResponse(STATIC / "index.html", headers={"Cache-Control": "no-cache"})


@router.get("/api/health", response_model=HealthReport)
async def health(service: Service) -> HealthReport:
    """Each component's state: retriever, index, policy, its engine (vLLM), Redis, workers and their queue,
    the trainer's runs API."""
    return await service.health()


@router.get("/healthz")
async def healthz() -> dict:
    return {"status": "ok"}


@router.get("/readyz")
async def readyz() -> dict:
    return {"status": "ready"}
