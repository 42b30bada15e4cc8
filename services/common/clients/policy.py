"""Typed HTTP clients for the policy service."""

from __future__ import annotations

import os
from typing import Any

from services.common.checkpoints import Manifest
from services.common.clients.base import SyncServiceClient
from services.common.schemas.checkpoints import ActivationResponse, CheckpointList
from services.common.schemas.policy import (
    AgentQueryRequest,
    AgentQueryResponse,
    FeedbackRequest,
    FeedbackResponse,
    RolloutRequest,
    RolloutResponse,
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

    def rollouts(self, request: RolloutRequest) -> RolloutResponse:
        return RolloutResponse.model_validate(self._call("POST", "/v1/agent/rollouts", json=request.model_dump()))

    def feedback(self, request: FeedbackRequest) -> FeedbackResponse:
        body = request.model_dump(exclude_none=True)
        return FeedbackResponse.model_validate(self._call("POST", "/v1/feedback", json=body))

    def trajectory(self, trajectory_id: str) -> TrajectoryRecord:
        return TrajectoryRecord.model_validate(self._call("GET", f"/v1/trajectories/{trajectory_id}"))

    def checkpoints(self) -> CheckpointList:
        return CheckpointList.model_validate(self._call("GET", "/v1/checkpoints"))

    def register(self, path: str) -> Manifest:
        return Manifest.model_validate(self._call("POST", "/v1/checkpoints", json={"path": path}))

    def activate(self, version: str) -> ActivationResponse:
        return ActivationResponse.model_validate(self._call("POST", f"/v1/checkpoints/{version}/activate"))

    def rollback(self) -> ActivationResponse:
        return ActivationResponse.model_validate(self._call("POST", "/v1/checkpoints/rollback"))
