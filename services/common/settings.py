"""Settings shared by every BRIDGE process, read from the environment in one place.

Each service subclasses `CommonSettings` with its own env prefix; nothing here is built at import time.
"""

from __future__ import annotations

import logging
import os
import secrets
from pathlib import Path
from typing import Literal
from urllib.parse import quote, urlsplit, urlunsplit

from pydantic import AliasChoices, Field, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

DEFAULT_DATA_DIR = Path.home() / ".bridge"
DEFAULT_REDIS_URL = "redis://127.0.0.1:6379/0"
RETRIEVER_MODEL_NAME = "all-MiniLM-L6-v2"
POLICY_MODEL_NAME = "SmolLM2-135M-Instruct"
# The base merged with the default shipped LoRA (services/modeling/adapters/reading/), written by `prepare`.
WARMSTART_MODEL_NAME = "SmolLM2-135M-Instruct-warmstart"
log = logging.getLogger(__name__)


class CommonSettings(BaseSettings):
    """Where data lives and how the processes find each other (`BRIDGE_*`, `REDIS_URL`, `QDRANT_URL`).

    Only `BRIDGE_*` variables configure BRIDGE (besides the two conventional URLs): an unprefixed `DATA_DIR`,
    `ADMIN_TOKEN`, `ENVIRONMENT` or `CHECKPOINT_DIR`, set for some other program, is ignored. Keyword arguments
    take the field names (`CommonSettings(data_dir=...)`)."""

    model_config = SettingsConfigDict(env_prefix="BRIDGE_", extra="ignore", populate_by_name=True)

    # Explicit aliases: a service's own prefix (BRIDGE_RETRIEVER_...) must not hide the shared variables. Only the
    # BRIDGE_ name: an alias without the prefix would be read from the environment too, case-insensitively.
    data_dir: Path = Field(
        DEFAULT_DATA_DIR,
        validation_alias=AliasChoices("BRIDGE_DATA_DIR"),
        description="Root of models, indexes, checkpoints and logs.",
    )
    admin_token: str | None = Field(
        None,
        validation_alias=AliasChoices("BRIDGE_ADMIN_TOKEN"),
        description="Bearer token for admin endpoints; a server generates it into the data dir when unset.",
    )
    checkpoint_dir: Path | None = Field(
        None,
        validation_alias=AliasChoices("BRIDGE_CHECKPOINT_DIR"),
        description="Checkpoint root shared by the trainer and both services (default <data_dir>/checkpoints).",
    )
    redis_url: str | None = Field(
        None,
        validation_alias=AliasChoices("REDIS_URL", "redis_url"),
        description="Trajectory streams and Celery broker; unset: 127.0.0.1:6379 (`bridge-rl up`: else an embedded "
        "redis-server).",
    )
    redis_password_file: Path | None = Field(
        None,
        validation_alias=AliasChoices("BRIDGE_REDIS_PASSWORD_FILE"),
        description="A file holding Redis's password (`requirepass`; compose mounts it as a secret), put into the "
        "Redis URL of every client here, so the password never sits in an environment variable.",
    )
    qdrant_url: str | None = Field(
        None,
        validation_alias=AliasChoices("QDRANT_URL", "qdrant_url"),
        description="A Qdrant server for the retriever's index; unset: Qdrant Edge in-process.",
    )
    trusted_hosts: str = Field(
        "*",
        validation_alias=AliasChoices("BRIDGE_TRUSTED_HOSTS"),
        description="Comma-separated Host header values a server answers (a leading '*.' matches subdomains); "
        "any other host gets a 400. '*' (the default) answers every host: set it where a browser can reach the "
        "service under a name you do not control (DNS rebinding).",
    )
    environment: str = Field(
        "development",
        validation_alias=AliasChoices("BRIDGE_ENVIRONMENT"),
        description="'production' refuses a missing admin token.",
    )
    # The retriever's encoder (both towers, in the retriever service and the trainer alike). Unset: the preset of
    # the model folder (services/modeling/encoder.py: e5, BGE or MiniLM, from its name or sentence-transformers
    # files). An empty prefix is an explicit "none".
    encoder_query_prefix: str | None = Field(
        None,
        validation_alias=AliasChoices("BRIDGE_ENCODER_QUERY_PREFIX"),
        description="Put before every query (e5: 'query: '; BGE: its instruction). Default: the model's preset.",
    )
    encoder_passage_prefix: str | None = Field(
        None,
        validation_alias=AliasChoices("BRIDGE_ENCODER_PASSAGE_PREFIX"),
        description="Put before every passage (e5: 'passage: '). Default: the model's preset.",
    )
    encoder_pooling: Literal["mean", "cls"] | None = Field(
        None, validation_alias=AliasChoices("BRIDGE_ENCODER_POOLING"), description="Default: the model's preset."
    )
    encoder_normalize: bool | None = Field(
        None,
        validation_alias=AliasChoices("BRIDGE_ENCODER_NORMALIZE"),
        description="L2-normalise the vectors. Default: the model's preset.",
    )

    @field_validator("data_dir")
    @classmethod
    def _expand(cls, value: Path) -> Path:
        return value.expanduser().resolve()

    @property
    def encoder_overrides(self) -> dict[str, str | bool]:
        """The encoder settings that were set, as keyword arguments of `SentenceEncoder.from_pretrained`."""
        given = {
            "query_prefix": self.encoder_query_prefix,
            "passage_prefix": self.encoder_passage_prefix,
            "pooling": self.encoder_pooling,
            "normalize": self.encoder_normalize,
        }
        return {name: value for name, value in given.items() if value is not None}

    @property
    def resolved_redis_url(self) -> str:
        """The one Redis URL every client of this process uses: `REDIS_URL` (default the local server), with the
        password from `BRIDGE_REDIS_PASSWORD_FILE` when the URL carries none."""
        url = self.redis_url or DEFAULT_REDIS_URL
        if self.redis_password_file is None:
            return url
        parts = urlsplit(url)
        if parts.password:
            return url
        password = quote(self.redis_password_file.read_text().strip(), safe="")
        netloc = f"{parts.username or ''}:{password}@{parts.hostname}" + (f":{parts.port}" if parts.port else "")
        return urlunsplit(parts._replace(netloc=netloc))

    @property
    def resolved_trusted_hosts(self) -> list[str]:
        return [h.strip() for h in self.trusted_hosts.split(",") if h.strip()] or ["*"]

    @property
    def admin_token_file(self) -> Path:
        return self.data_dir / "admin_token"

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

    def stored_admin_token(self) -> str | None:
        """A client's token: the configured one, else the one a server on this host keeps in
        `<data_dir>/admin_token`, else None. Never creates the file (a token made up here would only get a 403)."""
        if self.admin_token:
            return self.admin_token
        path = self.admin_token_file
        return (path.read_text().strip() or None) if path.exists() else None

    def resolve_admin_token(self) -> str:
        """A server's token: the configured one, else one generated once and kept in `<data_dir>/admin_token`
        (mode 600). Only a process that serves admin endpoints (or starts the services) calls this; clients call
        `stored_admin_token`."""
        if self.admin_token:
            return self.admin_token
        if self.environment == "production":
            raise ValueError("BRIDGE_ADMIN_TOKEN must be set when BRIDGE_ENVIRONMENT=production")
        path = self.admin_token_file
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
