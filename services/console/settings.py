from __future__ import annotations

from pydantic import Field
from pydantic_settings import SettingsConfigDict

from services.common.settings import CommonSettings


class ConsoleSettings(CommonSettings):
    """`BRIDGE_CONSOLE_*` (plus the common `BRIDGE_*` and `REDIS_URL`). The console holds no secret: the admin
    token and API key come from the person at the browser and are passed through on each call."""

    model_config = SettingsConfigDict(env_prefix="BRIDGE_CONSOLE_", extra="ignore", populate_by_name=True)

    host: str = Field("127.0.0.1", description="Bind address (0.0.0.0: every interface).")
    port: int = Field(8002, description="Port of the web console.")
    policy_url: str = Field("http://127.0.0.1:8000", description="The policy service.")
    retriever_url: str = Field("http://127.0.0.1:8001", description="The retriever service.")
    trainer_url: str = Field(
        "http://127.0.0.1:9108", description="A trainer worker's metrics port: its /metrics and the runs API."
    )
    trainer_queue: str = Field("bridge", description="The workers' Celery queue (BRIDGE_TRAINER_QUEUE).")
    request_timeout_s: float = Field(900, ge=1, description="Cap on one proxied call (a streamed answer included).")
    health_timeout_s: float = Field(3, gt=0, le=60, description="Cap on each probe of the health view.")
