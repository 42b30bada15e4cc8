"""A run's folder: where each round step writes its outputs (one file each, replaced atomically), so a
step that finds its output returns early and a run resumes at the first missing file; plus starting and
failing a run."""

from __future__ import annotations

import json
import logging
import os
import uuid
from pathlib import Path

import redis

from services.common.clients.policy import PolicyClient
from services.common.clients.retriever import RetrieverClient
from services.common.schemas.policy import ServingConfig
from services.data.files import DataRows
from services.data.split import training_data, training_questions
from services.trainer.config_file import to_toml
from services.trainer.rollout import (
    ensure_group,
)
from services.trainer.run_state import RunConfig, RunState
from services.trainer.settings import TrainerSettings
from services.trainer.trackers import check_trackers

log = logging.getLogger(__name__)


def redis_client(settings: TrainerSettings) -> redis.Redis:
    return redis.Redis.from_url(settings.resolved_redis_url, decode_responses=True)


def source_stream(settings: TrainerSettings, config: RunConfig) -> str:
    """The stream a run's trajectories come from, and are acknowledged on once published: served trajectories with
    feedback for a live run, the run's own rollouts otherwise."""
    return settings.feedback_stream if config.source == "live" else settings.trajectory_stream


QUESTIONS = "questions.jsonl"


class LiveTrafficRefused(ValueError):
    """A live run that asks to train the retriever on traffic that can never train it."""


def check_live_traffic(config: RunConfig, serving: ServingConfig) -> None:
    """Every retriever term needs sampled searches (`algo.round.retriever_unchanged_reason`): on a policy service
    that serves greedy retrieval only, a live run that updates the retriever would publish nothing but policies."""
    if config.source != "live" or not config.algo.updates_retriever or serving.explores_retrieval:
        return
    why = "greedy retrieval" if serving.retrieval == "greedy" else "retrieval_share 0"
    raise LiveTrafficRefused(
        f"the policy service serves {why}, so its traffic can never train the retriever: serve with exploration "
        "(BRIDGE_POLICY_SERVE_RETRIEVAL=sample, BRIDGE_POLICY_SERVE_RETRIEVAL_SHARE > 0) or train the policy alone "
        "(--algo search-r1)"
    )


def start_run(settings: TrainerSettings, config: RunConfig, data: DataRows | None = None) -> RunState:
    """A new run's folder and state (an existing run's state, as it is). A run on its own data (`config.data`)
    reads it here, once (or takes `data`, read already from that path), into <run>/questions.jsonl: the workers
    read that copy, never the user's path. A tracker of `config.report_to` that is not installed is refused here
    (`trackers.TrackerUnavailable`, one line), before anything is written; so is a live run that would train the
    retriever on traffic that cannot train it (`LiveTrafficRefused`)."""
    check_trackers(config.report_to)
    folder = settings.runs_dir / config.run_id
    if RunState.path(settings.runs_dir, config.run_id).exists():
        return RunState.load(settings.runs_dir, config.run_id)
    initial_policy = initial_retriever = "base"
    if config.source == "live":  # served trajectories come from whatever pair is live now
        with PolicyClient(settings.policy_url) as client:
            check_live_traffic(config, client.serving())
            initial_policy = client.checkpoints().active
        with RetrieverClient(settings.retriever_url) as client:
            initial_retriever = client.checkpoints().active
    if config.source != "live":  # fail now, not in a worker, when there are no questions
        if config.data is not None:
            data = data or training_data(config.data, settings.qa_dir)
        else:
            pool_questions(settings, config.dataset)
    if config.gate.canary:  # a canary that cannot be drawn fails the run now, not at its first publish
        canary_questions(settings, config)
    folder.mkdir(parents=True, exist_ok=True)
    if data is not None and config.data is not None:
        write_questions(folder / QUESTIONS, data.rows)
    r = redis_client(settings)
    ensure_group(r, source_stream(settings, config), config.run_id)
    state = RunState(config=config, lam=config.algo.initial_lambda)
    (folder / "config.toml").write_text(to_toml(config))
    state.initial_policy_version, state.initial_retriever_version = initial_policy, initial_retriever
    state.save(settings.runs_dir)
    return state


def rollout_ids(rows: list[dict]) -> list[dict]:
    """Rows whose ids are unique over the run, as a round's rollouts need (groups are keyed by item id): when the
    rows span several datasets, each id becomes `<dataset>/<id>` (FlashRAG's and Search-R1's ids restart in every
    dataset: nq and hotpotqa both have a train_0)."""
    if len({row["dataset"] for row in rows}) < 2:
        return rows
    return [{**row, "id": f"{row['dataset']}/{row['id']}"} for row in rows]


def write_questions(path: Path, rows: list[dict]) -> None:
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex[:6]}.tmp")
    with tmp.open("w") as fh:
        fh.writelines(json.dumps(row) + "\n" for row in rollout_ids(rows))
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)


def pool_questions(settings: TrainerSettings, dataset: str) -> list[dict]:
    """The dataset's training-pool questions, from the workers' question folder (never its evaluation split)."""
    try:
        return training_questions(settings.qa_dir, dataset)
    except FileNotFoundError as exc:
        raise FileNotFoundError(f"{exc} (set BRIDGE_TRAINER_QA_DIR)") from exc


def canary_questions(settings: TrainerSettings, config: RunConfig) -> list[dict]:
    """The promotion gate's canary (services/trainer/gate.py): the first `gate.canary` questions of the canary
    dataset's training pool, in file order, which the run's own training draws leave out."""
    pool = pool_questions(settings, config.canary_dataset)
    if len(pool) <= config.gate.canary:
        raise ValueError(f"{config.canary_dataset}'s training pool has {len(pool)} questions: too few for a canary of "
                         f"{config.gate.canary} and a round to train on")  # fmt: skip
    return pool[: config.gate.canary]


def run_questions(settings: TrainerSettings, config: RunConfig) -> list[dict]:
    """The training questions of a run: <run>/questions.jsonl for a run on its own data, else the dataset's
    training pool."""
    if config.data is None:
        pool = pool_questions(settings, config.dataset)
        if config.gate.canary and config.canary_dataset == config.dataset:
            return pool[len(canary_questions(settings, config)) :]  # the canary is never trained on
        return pool
    with (settings.runs_dir / config.run_id / QUESTIONS).open() as fh:
        return [json.loads(line) for line in fh if line.strip()]


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
