from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Request

from services.common.errors import NotReady
from services.common.http import require_admin
from services.retriever.metrics import RetrieverMetrics
from services.retriever.service import RetrieverService


def get_service(request: Request) -> RetrieverService:
    service = getattr(request.app.state, "service", None)
    if service is None:
        raise NotReady("retriever is still loading")
    return service


def get_metrics(request: Request) -> RetrieverMetrics:
    return request.app.state.metrics


Service = Annotated[RetrieverService, Depends(get_service)]
Metrics = Annotated[RetrieverMetrics, Depends(get_metrics)]
Admin = Depends(require_admin)
