from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Annotated

from fastapi import Depends, Request

from services.common.http import app_metrics, app_service, require_admin
from services.policy.metrics import PolicyMetrics
from services.policy.service import PolicyService


async def get_service(request: Request) -> PolicyService:
    return app_service(request, "policy service is still loading")


async def rollout_slot(request: Request) -> AsyncIterator[None]:
    """A place among the rollout requests in flight (`max_rollouts_in_flight`), or a 429 with Retry-After."""
    async with request.app.state.rollout_limit.slot():
        yield


Service = Annotated[PolicyService, Depends(get_service)]
RolloutSlot = Depends(rollout_slot)
Metrics = Annotated[PolicyMetrics, Depends(app_metrics)]
Admin = Depends(require_admin)
