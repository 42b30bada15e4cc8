from __future__ import annotations

import socket
from pathlib import Path
from typing import Literal

from pydantic import AliasChoices, Field, model_validator
from pydantic_settings import SettingsConfigDict

from services.common.settings import CommonSettings


class RetrieverSettings(CommonSettings):
    """`BRIDGE_RETRIEVER_*` (plus the common `BRIDGE_*`, `QDRANT_URL`)."""

    model_config = SettingsConfigDict(env_prefix="BRIDGE_RETRIEVER_", extra="ignore", populate_by_name=True)

    host: str = Field("127.0.0.1", description="Bind address (0.0.0.0: every interface).")
    port: int = Field(8001, description="Port of the retriever service.")
    encoder_dir: str | None = Field(None, description="HF encoder folder; default <models>/all-MiniLM-L6-v2.")
    index_backend: Literal["edge", "qdrant-local", "qdrant-server"] | None = Field(
        None, description="Default: qdrant-server when QDRANT_URL is set, else edge (in-process Qdrant)."
    )
    alias: str = Field("bridge-docs", description="Qdrant alias of the live collection (flipped by a re-index).")
    hnsw_ef: int = Field(256, ge=8, le=4096, description="HNSW beam width; 256 keeps recall@10 >= 0.99 of exact.")
    max_length: int = Field(256, ge=8, le=512, description="Token cap per passage and query.")
    encode_batch_size: int = Field(16, ge=1, le=1024, description="Texts per encoder forward: small batches pad less.")
    dtype: Literal["auto", "float32", "bfloat16"] = Field(
        "auto",
        description="Serving precision. auto: bf16 where the CPU has native bf16 (~2x faster than fp32 there), "
        "else fp32 (emulated bf16 is ~85x slower on an AVX2-only CPU; services/common/hardware.py).",
    )
    pinned_versions: int = Field(
        2,
        ge=0,
        le=16,
        description="Versions that requests pin (`version`, not the active one) kept loaded after their request, the "
        "least recently pinned dropped first; 0: loaded and sha-checked again for every request.",
    )
    replica_group: str | None = Field(
        None,
        description="Replicas with this group name (and one REDIS_URL) hot-swap as one: a checkpoint registered or "
        "activated at any of them reaches all, prepared first, then committed together (services/common/replicas.py).",
    )
    replica_id: str | None = Field(None, description="This replica's name in its group (default: <hostname>:<port>).")
    state_dir_override: Path | None = Field(
        None,
        validation_alias=AliasChoices("BRIDGE_RETRIEVER_STATE_DIR", "state_dir"),
        description="Index, registry and document-log offset (default <data_dir>/retriever): one per replica; "
        "`{hostname}` in it is this host's name (compose's replicas share one volume, a folder each).",
    )
    replica_lag_bound_s: float = Field(
        30.0, gt=0, le=3600, description="How long a swap waits for a slow replica before committing without it."
    )
    max_body_bytes: int = Field(8 * 1024 * 1024, ge=1024, description="Larger request bodies get a 413.")
    batch_wait_ms: float = Field(
        1.0,
        ge=0.0,
        le=100.0,
        description="A micro-batch keeps gathering concurrent searches while they arrive less than this apart.",
    )
    max_searches_in_flight: int = Field(
        64,
        ge=1,
        le=10_000,
        description="Searches (/v1/search and /retrieve together) in this service at once; one more is a 429 with "
        "Retry-After. With max_query_chars_per_request, it bounds the work queued for the one search thread.",
    )
    max_query_chars_per_request: int = Field(
        128_000,
        ge=1_000,
        le=1_000_000,
        description="Characters of all queries of one search together (400 above): the one search thread serves "
        "every caller, so one request must not hold it for long. 128,000 is 256 queries of 500, above what a "
        "training round's searches hold (docs/operations.md).",
    )
    batch_max_wait_ms: float = Field(
        5.0,
        ge=0.0,
        le=1000.0,
        description="Cap on a micro-batch's gathering: the most one search waits for others before its forward.",
    )

    @model_validator(mode="after")
    def _waits(self) -> RetrieverSettings:
        if self.batch_max_wait_ms < self.batch_wait_ms:
            raise ValueError("batch_max_wait_ms must be >= batch_wait_ms")
        return self

    @property
    def resolved_backend(self) -> str:
        if self.index_backend:
            return self.index_backend
        return "qdrant-server" if self.qdrant_url else "edge"

    @property
    def state_dir(self) -> Path:
        if self.state_dir_override is None:
            return self.data_dir / "retriever"
        return Path(str(self.state_dir_override).replace("{hostname}", socket.gethostname()))
