from __future__ import annotations

import time
from typing import Annotated

from fastapi import APIRouter, Depends, Path

from services.common.errors import InvalidRequest
from services.common.http import require_api_key
from services.common.schemas.policy import (
    AgentQueryRequest,
    AgentQueryResponse,
    FeedbackRequest,
    FeedbackResponse,
    RolloutRequest,
    RolloutResponse,
    TrajectoryRecord,
)
from services.policy.routes.deps import Metrics, Service

AUTH_ERRORS = {
    401: {"description": "API keys are on and none was sent (`X-API-Key`)"},
    403: {"description": "The API key (or admin token) is not valid"},
}
# Every route here serves or reveals trajectories: all of them sit behind the optional API key.
router = APIRouter(dependencies=[Depends(require_api_key)], responses=AUTH_ERRORS)
ERRORS = {
    400: {"description": "Over this deployment's bounds (reason in `detail`)"},
    422: {"description": "Invalid body (reason in `detail`)"},
    502: {"description": "The LLM engine or the retriever failed"},
}


@router.post("/v1/agent/query", response_model=AgentQueryResponse, responses=ERRORS)
async def agent_query(body: AgentQueryRequest, service: Service, metrics: Metrics) -> AgentQueryResponse:
    started = time.perf_counter()
    response = await service.query(body)
    metrics.query_seconds.observe(time.perf_counter() - started)
    metrics.trajectories.labels("query").inc()
    return response


@router.post("/v1/agent/rollouts", response_model=RolloutResponse, responses=ERRORS)
async def agent_rollouts(body: RolloutRequest, service: Service, metrics: Metrics) -> RolloutResponse:
    cap = service.settings.max_rollout_trajectories
    if len(body.items) * body.group_size > cap:
        raise InvalidRequest(f"items x group_size must be at most {cap} on this deployment", param="group_size")
    response = await service.rollouts(body)
    metrics.trajectories.labels("rollout").inc(len(response.trajectories))
    for t in response.trajectories:
        metrics.reward.observe(t.reward)
    return response


@router.post("/v1/feedback", response_model=FeedbackResponse, responses={404: {"description": "Unknown id"}})
async def feedback(body: FeedbackRequest, service: Service) -> FeedbackResponse:
    return await service.feedback(body)


@router.get("/v1/trajectories/{trajectory_id}", response_model=TrajectoryRecord,
            responses={404: {"description": "Unknown id"}})  # fmt: skip
async def get_trajectory(
    trajectory_id: Annotated[str, Path(min_length=1, max_length=64)], service: Service
) -> TrajectoryRecord:
    return await service.trajectory(trajectory_id)
