from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Annotated

from fastapi import Depends, Request

from services.common.http import app_metrics, app_service, require_admin
from services.retriever.metrics import RetrieverMetrics
from services.retriever.service import RetrieverService


async def get_service(request: Request) -> RetrieverService:
    return app_service(request, "retriever is still loading")


async def search_slot(request: Request) -> AsyncIterator[None]:
    """A place among the searches in flight (`max_searches_in_flight`), or a 429 with Retry-After."""
    async with request.app.state.search_limit.slot():
        yield


Service = Annotated[RetrieverService, Depends(get_service)]
SearchSlot = Depends(search_slot)
Metrics = Annotated[RetrieverMetrics, Depends(app_metrics)]
Admin = Depends(require_admin)
