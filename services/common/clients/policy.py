"""Typed HTTP clients for the policy service."""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

from services.common.checkpoints import Manifest
from services.common.clients.base import SyncServiceClient, _raise_for, service_error
from services.common.schemas.agent_events import AGENT_EVENT, AgentEvent
from services.common.schemas.checkpoints import ActivationResponse, CheckpointList
from services.common.schemas.policy import (
    AgentQueryRequest,
    AgentQueryResponse,
    FeedbackRequest,
    FeedbackResponse,
    RolloutRequest,
    RolloutResponse,
    ServingConfig,
    TrajectoryRecord,
)

API_KEY_ENV = "BRIDGE_API_KEY"


class PolicyClient(SyncServiceClient):
    """`api_key` defaults to `$BRIDGE_API_KEY` (as OpenAI's client reads OPENAI_API_KEY), so every caller, the CLI
    included, works against a policy that has API keys on. The admin token is accepted there too."""

    def __init__(
        self, base_url: str, admin_token: str | None = None, timeout: float = 900.0, api_key: str | None = None
    ) -> None:
        super().__init__(base_url, admin_token, timeout, api_key or os.environ.get(API_KEY_ENV) or None)

    def query(self, question: str, **params: Any) -> AgentQueryResponse:
        body = AgentQueryRequest(question=question, **params).model_dump()
        return AgentQueryResponse.model_validate(self._call("POST", "/v1/agent/query", json=body))

    def query_stream(self, question: str, **params: Any) -> Iterator[AgentEvent]:
        """The steps of the answer as the service sends them (Server-Sent Events), ending with `done`. A refusal
        before the stream, or an `error` event in it, raises `ServiceError`."""
        body = AgentQueryRequest(question=question, stream=True, **params).model_dump()
        with self._http.stream("POST", "/v1/agent/query", json=body) as response:
            if not response.is_success:
                response.read()
                _raise_for(response)
            for line in response.iter_lines():
                if line.startswith("data: "):
                    event = AGENT_EVENT.validate_json(line.removeprefix("data: "))
                    if event.type == "error":
                        code = str(event.error.get("code") or "")
                        raise service_error(int(code) if code.isdigit() else 500, event.detail)
                    yield event

    def rollouts(self, request: RolloutRequest) -> RolloutResponse:
        return RolloutResponse.model_validate(self._call("POST", "/v1/agent/rollouts", json=request.model_dump()))

    def feedback(self, request: FeedbackRequest) -> FeedbackResponse:
        body = request.model_dump(exclude_none=True)
        return FeedbackResponse.model_validate(self._call("POST", "/v1/feedback", json=body))

    def trajectory(self, trajectory_id: str) -> TrajectoryRecord:
        return TrajectoryRecord.model_validate(self._call("GET", f"/v1/trajectories/{trajectory_id}"))

    def serving(self) -> ServingConfig:
        return ServingConfig.model_validate(self._call("GET", "/v1/serving"))

    def checkpoints(self) -> CheckpointList:
        return CheckpointList.model_validate(self._call("GET", "/v1/checkpoints"))

    def register(self, path: str) -> Manifest:
        return Manifest.model_validate(self._call("POST", "/v1/checkpoints", json={"path": path}))

    def activate(self, version: str) -> ActivationResponse:
        return ActivationResponse.model_validate(self._call("POST", f"/v1/checkpoints/{version}/activate"))

    def rollback(self) -> ActivationResponse:
        return ActivationResponse.model_validate(self._call("POST", "/v1/checkpoints/rollback"))
