from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator
from contextlib import aclosing
from typing import Annotated

from fastapi import APIRouter, Depends, Path, Query
from fastapi.responses import StreamingResponse

from services.common.errors import BridgeError, InvalidRequest, error_body
from services.common.http import require_api_key, require_training_key
from services.common.schemas.agent_events import ErrorEvent, sse_frame
from services.common.schemas.policy import (
    AgentQueryRequest,
    AgentQueryResponse,
    FeedbackRequest,
    FeedbackResponse,
    RolloutRequest,
    RolloutResponse,
    TrajectoryList,
    TrajectoryRecord,
    TrajectoryTokens,
)
from services.policy.metrics import PolicyMetrics
from services.policy.routes.deps import Admin, Metrics, RolloutSlot, Service

log = logging.getLogger(__name__)

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


SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
STREAM_RESPONSE = {
    "description": 'With `"stream": true`: Server-Sent Events (`event: <type>`, `data: <json>`), one per step: '
    "start, delta (generated text), search, documents, answer, then done (this same response), or a final "
    "error event if the run fails after the stream began (services/common/schemas/agent_events.py).",
    "content": {"text/event-stream": {"schema": {"type": "string"}}},
}


def error_event(exc: Exception) -> ErrorEvent:
    """A failure after the 200 went out: the same envelope as an error response, as the stream's last event."""
    if isinstance(exc, BridgeError):
        body = error_body(exc.status_code, exc.type, exc.message, exc.param, exc.code)
    else:
        body = error_body(500, "internal_error", "the agent failed; see the policy service log")
    return ErrorEvent(error=body["error"], detail=body["detail"])


async def stream_events(events: AsyncIterator, metrics: PolicyMetrics) -> AsyncIterator[str]:
    started = time.perf_counter()
    async with aclosing(events):
        try:
            async for event in events:
                yield sse_frame(event)
        except Exception as exc:
            if not isinstance(exc, BridgeError):
                log.exception("streamed query failed")
            yield sse_frame(error_event(exc))
            return
    metrics.query_seconds.observe(time.perf_counter() - started)
    metrics.trajectories.labels("query").inc()


@router.post("/v1/agent/query", response_model=AgentQueryResponse, responses={**ERRORS, 200: STREAM_RESPONSE})
async def agent_query(body: AgentQueryRequest, service: Service, metrics: Metrics):
    if body.stream:
        events = stream_events(service.query_stream(body), metrics)
        return StreamingResponse(events, media_type="text/event-stream", headers=SSE_HEADERS)
    started = time.perf_counter()
    response = await service.query(body)
    metrics.query_seconds.observe(time.perf_counter() - started)
    metrics.trajectories.labels("query").inc()
    return response


@router.post(
    "/v1/agent/rollouts",
    response_model=RolloutResponse,
    dependencies=[Depends(require_training_key), RolloutSlot],
    responses={
        **ERRORS,
        409: {"description": "A pinned policy or retriever version is not registered"},
        429: {"description": "As many rollout requests in flight as this deployment allows: retry after Retry-After"},
    },
)
async def agent_rollouts(body: RolloutRequest, service: Service, metrics: Metrics) -> RolloutResponse:
    cap = service.settings.max_rollout_trajectories
    if len(body.items) * body.group_size > cap:
        raise InvalidRequest(f"items x group_size must be at most {cap} on this deployment", param="group_size")
    response = await service.rollouts(body)
    metrics.trajectories.labels("rollout").inc(len(response.trajectories))
    for t in response.trajectories:
        metrics.reward.observe(t.reward)
    return response


@router.post(
    "/v1/feedback",
    response_model=FeedbackResponse,
    dependencies=[Depends(require_training_key)],
    responses={
        404: {"description": "Unknown id"},
        409: {"description": "The trajectory was cut short, or already has its feedback (one per trajectory)"},
    },
)
async def feedback(body: FeedbackRequest, service: Service) -> FeedbackResponse:
    return await service.feedback(body)


@router.get("/v1/trajectories", response_model=TrajectoryList, dependencies=[Admin])
async def list_trajectories(
    service: Service,
    limit: Annotated[int, Query(ge=1, le=200)] = 50,
    policy_version: Annotated[str | None, Query(max_length=128)] = None,
    retriever_version: Annotated[str | None, Query(max_length=128)] = None,
    min_reward: Annotated[float | None, Query(ge=-10.0, le=10.0)] = None,
) -> TrajectoryList:
    """The latest logged trajectories (served queries and training rollouts), newest first, with their reward
    as it is now. Every user's questions and gold answers: the admin token only (one trajectory stays readable
    by its id, which only its caller was given)."""
    return await service.latest_trajectories(limit, policy_version, retriever_version, min_reward)


@router.get("/v1/trajectories/{trajectory_id}/tokens", response_model=TrajectoryTokens,
            responses={404: {"description": "Unknown id"}})  # fmt: skip
async def get_trajectory_tokens(
    trajectory_id: Annotated[str, Path(min_length=1, max_length=64)], service: Service
) -> TrajectoryTokens:
    """Every token of a trajectory decoded on its own: prompt, generated (trained on) and observation (masked)."""
    return await service.trajectory_tokens(trajectory_id)


@router.get("/v1/trajectories/{trajectory_id}", response_model=TrajectoryRecord,
            responses={404: {"description": "Unknown id"}})  # fmt: skip
async def get_trajectory(
    trajectory_id: Annotated[str, Path(min_length=1, max_length=64)], service: Service
) -> TrajectoryRecord:
    return await service.trajectory(trajectory_id)
