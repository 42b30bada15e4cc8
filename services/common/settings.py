"""Settings shared by every BRIDGE process, read from the environment in one place.

Each service subclasses `CommonSettings` with its own env prefix; nothing here is built at import time.
"""

from __future__ import annotations

import logging
import os
import secrets
from pathlib import Path

from pydantic import AliasChoices, Field, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

DEFAULT_DATA_DIR = Path.home() / ".bridge"
RETRIEVER_MODEL_NAME = "all-MiniLM-L6-v2"
POLICY_MODEL_NAME = "SmolLM2-135M-Instruct"
# The base merged with the shipped warm-start LoRA (services/policy/warmstart_adapter/), written by `prepare`.
WARMSTART_MODEL_NAME = "SmolLM2-135M-Instruct-warmstart"
log = logging.getLogger(__name__)


class CommonSettings(BaseSettings):
    """Where data lives and how the processes find each other (`BRIDGE_*`, `REDIS_URL`, `QDRANT_URL`)."""

    model_config = SettingsConfigDict(env_prefix="BRIDGE_", extra="ignore", populate_by_name=True)

    # Explicit aliases: a service's own prefix (BRIDGE_RETRIEVER_...) must not hide the shared variables.
    data_dir: Path = Field(
        DEFAULT_DATA_DIR,
        validation_alias=AliasChoices("BRIDGE_DATA_DIR", "data_dir"),
        description="Root of models, indexes, checkpoints and logs.",
    )
    admin_token: str | None = Field(
        None,
        validation_alias=AliasChoices("BRIDGE_ADMIN_TOKEN", "admin_token"),
        description="Bearer token for admin endpoints; generated into the data dir when unset.",
    )
    checkpoint_dir: Path | None = Field(
        None,
        validation_alias=AliasChoices("BRIDGE_CHECKPOINT_DIR", "checkpoint_dir"),
        description="Checkpoint root shared by the trainer and both services (default <data_dir>/checkpoints).",
    )
    redis_url: str | None = Field(None, validation_alias=AliasChoices("REDIS_URL", "redis_url"))
    qdrant_url: str | None = Field(None, validation_alias=AliasChoices("QDRANT_URL", "qdrant_url"))
    environment: str = Field(
        "development",
        validation_alias=AliasChoices("BRIDGE_ENVIRONMENT", "environment"),
        description="'production' refuses a missing admin token.",
    )

    @field_validator("data_dir")
    @classmethod
    def _expand(cls, value: Path) -> Path:
        return value.expanduser().resolve()

    @property
    def models_dir(self) -> Path:
        return self.data_dir / "models"

    @property
    def checkpoint_root(self) -> Path:
        return (self.checkpoint_dir or self.data_dir / "checkpoints").expanduser().resolve()

    @property
    def retriever_model_dir(self) -> Path:
        return self.models_dir / RETRIEVER_MODEL_NAME

    @property
    def base_policy_model_dir(self) -> Path:
        """SmolLM2-135M-Instruct as converted from its GGUF, untrained (what the warm start trains from)."""
        return self.models_dir / POLICY_MODEL_NAME

    @property
    def warmstart_policy_model_dir(self) -> Path:
        return self.models_dir / WARMSTART_MODEL_NAME

    @property
    def policy_model_dir(self) -> Path:
        """The default policy: the warm-started model once `bridge-rl prepare` has merged it, else the base."""
        merged = self.warmstart_policy_model_dir
        return merged if (merged / "config.json").exists() else self.base_policy_model_dir

    def resolve_admin_token(self) -> str:
        """The configured token, else one generated once and kept in `<data_dir>/admin_token` (mode 600)."""
        if self.admin_token:
            return self.admin_token
        if self.environment == "production":
            raise ValueError("BRIDGE_ADMIN_TOKEN must be set when BRIDGE_ENVIRONMENT=production")
        path = self.data_dir / "admin_token"
        if not path.exists():
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_suffix(".tmp")
            # Created 0600 from the start: no moment in which another user could read it.
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            with os.fdopen(fd, "w") as fh:
                fh.write(secrets.token_urlsafe(32))
            tmp.replace(path)
            log.warning("BRIDGE_ADMIN_TOKEN is unset: generated an admin token into %s (mode 600)", path)
        else:
            log.info("BRIDGE_ADMIN_TOKEN is unset: using the admin token stored in %s", path)
        return path.read_text().strip()
