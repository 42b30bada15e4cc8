"""Wire models of the trainer's read-only runs API (`GET /v1/runs`, `GET /v1/runs/{run_id}` on a worker's
metrics port, :9108 by default). A run's folder stays the source of truth; these are views of it."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field


class RunSummary(BaseModel):
    run_id: str
    algo: str
    estimator: str | None = None
    dataset: str | None = None
    source: str | None = None
    status: str
    rounds: int
    rounds_done: int = Field(description="Rounds published so far.")
    retriever_version: str | None = None
    policy_version: str | None = None
    error: str | None = None
    latest: dict[str, Any] | None = Field(None, description="The last round's metrics row.")


class RunList(BaseModel):
    runs: list[RunSummary]


class RunDetail(BaseModel):
    summary: RunSummary
    config: dict[str, Any] = Field(description="The run's RunConfig (algorithm config under 'algo').")
    metrics: list[dict[str, Any]] = Field(
        description="metrics.jsonl, one row per round: reward/em/f1/recall, loss/*, lambda, time/*, memory/*."
    )
