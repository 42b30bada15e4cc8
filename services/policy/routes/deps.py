from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Request

from services.common.http import app_metrics, app_service, require_admin
from services.policy.metrics import PolicyMetrics
from services.policy.service import PolicyService


async def get_service(request: Request) -> PolicyService:
    return app_service(request, "policy service is still loading")


Service = Annotated[PolicyService, Depends(get_service)]
Metrics = Annotated[PolicyMetrics, Depends(app_metrics)]
Admin = Depends(require_admin)
