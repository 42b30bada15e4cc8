"""A run's folder: where each round step writes its outputs (one file each, replaced atomically), so a
step that finds its output returns early and a run resumes at the first missing file; plus starting and
failing a run."""

from __future__ import annotations

import logging

import redis

from services.common.clients.policy import PolicyClient
from services.trainer.config_file import to_toml
from services.trainer.rollout import (
    ensure_group,
)
from services.trainer.run_state import RunConfig, RunState
from services.trainer.settings import TrainerSettings

log = logging.getLogger(__name__)


def redis_client(settings: TrainerSettings) -> redis.Redis:
    return redis.Redis.from_url(settings.resolved_redis_url, decode_responses=True)


def source_stream(settings: TrainerSettings, config: RunConfig) -> str:
    """The stream a run's trajectories come from, and are acknowledged on once published: served trajectories with
    feedback for a live run, the run's own rollouts otherwise."""
    return settings.feedback_stream if config.source == "live" else settings.trajectory_stream


def start_run(settings: TrainerSettings, config: RunConfig) -> RunState:
    folder = settings.runs_dir / config.run_id
    if RunState.path(settings.runs_dir, config.run_id).exists():
        return RunState.load(settings.runs_dir, config.run_id)
    folder.mkdir(parents=True, exist_ok=True)
    r = redis_client(settings)
    if config.source != "live":
        settings.training_questions(config.dataset)  # fail now, not in a worker, when there are none
    ensure_group(r, source_stream(settings, config), config.run_id)
    state = RunState(config=config, lam=config.algo.initial_lambda)
    (folder / "config.toml").write_text(to_toml(config))
    if config.source == "live":  # served trajectories come from whatever policy is live now
        with PolicyClient(settings.policy_url) as client:
            state.initial_policy_version = client.checkpoints().active
    state.save(settings.runs_dir)
    return state


def round_dir(settings: TrainerSettings, run_id: str, round_index: int):
    path = settings.runs_dir / run_id / f"round-{round_index:04d}"
    path.mkdir(parents=True, exist_ok=True)
    return path


def rollouts_file(collection: str) -> str:
    return f"rollouts-{collection}.json" if collection else "rollouts.json"


OPTIMIZER_DIR = "optimizer"


TRAINED = {"round": "trained.json", "retriever": "trained-retriever.json", "policy": "trained.json"}


PUBLISHED_RETRIEVER = "published-retriever.json"


def mark_failed(settings: TrainerSettings, run_id: str, error: str) -> None:
    state = RunState.load(settings.runs_dir, run_id)
    state.status, state.error = "failed", error[:2000]
    state.save(settings.runs_dir)
