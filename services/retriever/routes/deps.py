from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Request

from services.common.http import app_metrics, app_service, require_admin
from services.retriever.metrics import RetrieverMetrics
from services.retriever.service import RetrieverService


async def get_service(request: Request) -> RetrieverService:
    return app_service(request, "retriever is still loading")


Service = Annotated[RetrieverService, Depends(get_service)]
Metrics = Annotated[RetrieverMetrics, Depends(app_metrics)]
Admin = Depends(require_admin)
