from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field, model_validator
from pydantic_settings import SettingsConfigDict

from services.common.hardware import parse_cpu_list
from services.common.settings import CommonSettings

DEMO_QA_DIR = Path(__file__).resolve().parents[1] / "demo_data"


class MissingAdminToken(RuntimeError):
    """The trainer has no admin token for the services (permanent: a retry would fail the same way)."""


class TrainerSettings(CommonSettings):
    """`BRIDGE_TRAINER_*` (plus the common `BRIDGE_*` and `REDIS_URL`)."""

    model_config = SettingsConfigDict(env_prefix="BRIDGE_TRAINER_", extra="ignore", populate_by_name=True)

    policy_url: str = Field("http://127.0.0.1:8000", description="The policy service (rollouts, publishing).")
    retriever_url: str = Field("http://127.0.0.1:8001", description="The retriever service (publishing).")
    qa_dir: Path = Field(
        DEMO_QA_DIR,
        description="Where <dataset>_train.jsonl (all training) or <dataset>.jsonl (trained on after its "
        "evaluation split) live.",
    )
    trajectory_stream: str = Field("bridge:trajectories", description="Must match the policy service's stream.")
    policy_base_dir: Path | None = Field(
        None, description="Base policy folder; default <models>/SmolLM2-135M-Instruct."
    )
    retriever_base_dir: Path | None = Field(None, description="Base encoder folder; default <models>/all-MiniLM-L6-v2.")
    task_time_limit_s: int = Field(
        3600,
        ge=60,
        description="Hard limit per task; the broker's visibility "
        "timeout is set above it so a running task is never handed out twice.",
    )
    feedback_stream: str = Field("bridge:feedback", description="Must match the policy service's feedback stream.")
    live_poll_s: float = Field(
        10, ge=0.1, description="Live: how often to look again for enough rewarded trajectories."
    )
    queue: str = Field(
        "bridge", description="Celery queue of this deployment's workers (isolates deployments that share a Redis)."
    )
    metrics_port: int = Field(
        9108,
        ge=0,
        le=65535,
        description="Serve the runs' latest round metrics (prometheus /metrics) here; 0: off. Held by another "
        "worker of this host: the next free port (logged).",
    )
    metrics_host: str = Field("127.0.0.1", description="Bind address of the metrics endpoint (0.0.0.0 in compose).")
    retry_max: int = Field(
        6,
        ge=0,
        le=100,
        description="Retries of a round step after a transient failure (502/503/504, connection "
        "refused or dropped, timeout, Redis unreachable) before the run is marked failed; 0: fail at once.",
    )
    retry_backoff_s: int = Field(
        2, ge=1, description="Seconds before the first retry; doubles with each retry (Celery's retry_backoff)."
    )
    retry_backoff_max_s: int = Field(60, ge=1, description="Cap on the wait between two retries, in seconds.")
    max_redeliveries: int = Field(
        2,
        ge=0,
        description="How often one step's message may come back after its worker was lost (acks_late requeues it: a "
        "step killed for memory would be killed again forever); one more fails the run with the reason.",
    )
    retry_jitter: bool = Field(True, description="Draw each wait uniformly from [0, backoff] (full jitter).")
    device: str = Field(
        "auto",
        description="Where the trainer computes: auto (the first CUDA GPU torch sees, else the CPU), cpu, cuda or "
        "cuda:N. A GPU asked for and not there is an error, never a silent fallback.",
    )
    precision: Literal["auto", "bfloat16", "float32"] = Field(
        "auto",
        description="Autocast of the trainer's forward passes: auto is bf16 on a GPU that has it and float32 on "
        "the CPU (the recorded results' numerics); bfloat16 forces it, float32 turns it off. Weights, optimizer "
        "state and the loss stay float32.",
    )
    cpus: str | None = Field(
        None,
        description="Cores the worker trains on, as a cpu list ('1', '2-3'); default all. On a box that also "
        "serves, keep them apart from vLLM's VLLM_CPU_OMP_THREADS_BIND: two OpenMP pools spinning on the same "
        "cores slow both by far more than half.",
    )

    @model_validator(mode="after")
    def _backoff_cap(self) -> TrainerSettings:
        if self.retry_backoff_max_s < self.retry_backoff_s:
            raise ValueError("retry_backoff_max_s must be at least retry_backoff_s")
        if self.cpus is not None:
            parse_cpu_list(self.cpus)
        return self

    @property
    def cpu_set(self) -> set[int] | None:
        return parse_cpu_list(self.cpus) if self.cpus else None

    @property
    def runs_dir(self) -> Path:
        return self.data_dir / "runs"

    @property
    def base_policy_dir(self) -> Path:
        return self.policy_base_dir or self.policy_model_dir

    @property
    def base_retriever_dir(self) -> Path:
        return self.retriever_base_dir or self.retriever_model_dir

    def services_admin_token(self) -> str:
        """The admin token the trainer sends to the retriever and the policy, a client of both: BRIDGE_ADMIN_TOKEN,
        else the one the servers of this host keep in <data_dir>/admin_token. Never creates that file (only a
        server does: a token made up here would only be refused); MissingAdminToken when there is none."""
        token = self.stored_admin_token()
        if token is None:
            raise MissingAdminToken(
                f"no admin token for the services: set BRIDGE_ADMIN_TOKEN to theirs (servers on this host keep it "
                f"in {self.admin_token_file}; none is there)"
            )
        return token
