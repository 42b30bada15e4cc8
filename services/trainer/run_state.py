"""A training run's persistent state: config, progress and what was published, one JSON file per run,
replaced atomically, so any worker can pick a run up where the last one left it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, Field, model_validator

from services.common.checkpoints import write_json_atomic
from services.trainer.algo.config import AlgoConfig


class RunConfig(BaseModel):
    run_id: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_-]{0,63}$")
    dataset: str
    rounds: int = Field(ge=1, le=10_000)
    questions_per_round: int = Field(ge=1, le=64)
    source: Literal["dataset", "live"] = Field(
        "dataset", description="dataset: rollouts on training questions; live: served trajectories with feedback."
    )
    live_batch: int = Field(8, ge=1, le=512, description="Live: rewarded trajectories per round.")
    max_staleness: int = Field(2, ge=0, le=100, description="Live: how many policy versions old a trajectory may be.")
    baseline_decay: float = Field(0.9, ge=0, lt=1, description="Live: EMA decay of the running reward baseline.")
    max_turns: int = Field(2, ge=0, le=8)
    rollout_temperature: float = Field(1.0, gt=0)
    retrieval_temperature: float = Field(0.05, gt=0)
    candidates: int = Field(20, ge=2, le=200)
    top_k: int = Field(3, ge=1, le=10)
    reward: Literal["em", "f1", "em-format"] = Field(
        "em",
        description="Training reward of a rollout: em (exact match, the paper's), f1 (token F1, as ReSearch and "
        "R1-Searcher) or em-format (Search-R1's qa_em_format: 0.2 for a well-formed trajectory, 1 only for a "
        "correct answer). Evaluation reports EM and F1 whatever this is.",
    )
    algo: AlgoConfig

    @model_validator(mode="after")
    def _fresh_needs_questions(self) -> RunConfig:
        if self.source == "live" and self.algo.policy_rollouts == "fresh":
            raise ValueError("policy_rollouts='fresh' needs questions to ask again; live runs have only served ones")
        return self


class Published(BaseModel):
    round: int
    retriever_version: str | None
    policy_version: str | None


class RunState(BaseModel):
    config: RunConfig
    status: Literal["running", "done", "failed"] = "running"
    next_round: int = 0
    lam: float
    published: list[Published] = Field(default_factory=list)
    retriever_weights: str | None = Field(None, description="Last published query tower (safetensors path).")
    policy_adapter: str | None = Field(None, description="Last published LoRA adapter folder.")
    optimizer_dir: str | None = Field(None, description="The optimizers' state after the last published round.")
    retriever_version: str | None = None
    policy_version: str | None = None
    error: str | None = None
    initial_policy_version: str = Field("base", description="The policy serving when the run started.")
    reward_baseline: float | None = Field(None, description="Live: running mean reward (advantage baseline).")

    @staticmethod
    def path(runs_dir: Path, run_id: str) -> Path:
        return runs_dir / run_id / "state.json"

    @classmethod
    def load(cls, runs_dir: Path, run_id: str) -> RunState:
        return cls.model_validate_json(cls.path(runs_dir, run_id).read_text())

    def save(self, runs_dir: Path) -> None:
        write_json_atomic(self.path(runs_dir, self.config.run_id), self.model_dump(mode="json"))


def append_metrics(runs_dir: Path, run_id: str, row: dict) -> None:
    with (runs_dir / run_id / "metrics.jsonl").open("a") as fh:
        fh.write(json.dumps(row) + "\n")


def read_metrics(runs_dir: Path, run_id: str) -> list[dict]:
    path = runs_dir / run_id / "metrics.jsonl"
    return [json.loads(line) for line in path.open()] if path.exists() else []
