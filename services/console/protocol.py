"""Wire models of the console's own endpoint (everything else it serves is the services' API, passed through)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, Field


class ComponentHealth(BaseModel):
    name: str
    state: Literal["ok", "down", "unknown"]
    detail: str = ""
    info: dict[str, Any] = Field(default_factory=dict)


class HealthReport(BaseModel):
    """`GET /api/health`: one line per component, probed now, each within the health timeout."""

    components: list[ComponentHealth]
