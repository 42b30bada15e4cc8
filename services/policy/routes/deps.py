from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Request

from services.common.errors import NotReady
from services.common.http import require_admin
from services.policy.metrics import PolicyMetrics
from services.policy.service import PolicyService


def get_service(request: Request) -> PolicyService:
    service = getattr(request.app.state, "service", None)
    if service is None:
        raise NotReady("policy service is still loading")
    return service


def get_metrics(request: Request) -> PolicyMetrics:
    return request.app.state.metrics


Service = Annotated[PolicyService, Depends(get_service)]
Metrics = Annotated[PolicyMetrics, Depends(get_metrics)]
Admin = Depends(require_admin)
