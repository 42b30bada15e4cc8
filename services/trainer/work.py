"""What the Celery tasks do, as plain functions keyed by (run_id, round) and safe to repeat."""

from __future__ import annotations

import json
import logging
import resource
import time

import numpy as np
import redis

from services.common.checkpoints import write_json_atomic
from services.common.clients.policy import PolicyClient
from services.common.clients.retriever import RetrieverClient
from services.trainer.algo.batch import build_batch
from services.trainer.algo.round import train_round
from services.trainer.checkpoint import policy_version, retriever_version, write_policy, write_retriever
from services.trainer.models import PolicyModel, RetrieverModel
from services.trainer.rollout import (
    ensure_group,
    group_name,
    load_round_rollouts,
    request_rollouts,
    rollout_tag,
    round_items,
    save_round_rollouts,
    take_from_stream,
    take_live,
)
from services.trainer.run_state import Published, RunConfig, RunState, append_metrics
from services.trainer.settings import TrainerSettings

log = logging.getLogger(__name__)


def _redis(settings: TrainerSettings) -> redis.Redis:
    return redis.Redis.from_url(settings.resolved_redis_url, decode_responses=True)


def start_run(settings: TrainerSettings, config: RunConfig) -> RunState:
    folder = settings.runs_dir / config.run_id
    if RunState.path(settings.runs_dir, config.run_id).exists():
        return RunState.load(settings.runs_dir, config.run_id)
    folder.mkdir(parents=True, exist_ok=True)
    r = _redis(settings)
    if config.source == "live":
        ensure_group(r, settings.feedback_stream, config.run_id)
    else:
        settings.qa_file(config.dataset)  # fail now, not in a worker, when the dataset is missing
        ensure_group(r, settings.trajectory_stream, config.run_id)
    state = RunState(config=config, lam=config.algo.lambda_init)
    if config.source == "live":  # served trajectories come from whatever policy is live now
        with PolicyClient(settings.policy_url) as client:
            state.initial_policy_version = client.checkpoints().active
    state.save(settings.runs_dir)
    return state


def round_dir(settings: TrainerSettings, run_id: str, round_index: int):
    path = settings.runs_dir / run_id / f"round-{round_index:04d}"
    path.mkdir(parents=True, exist_ok=True)
    return path


def collect(settings: TrainerSettings, run_id: str, round_index: int) -> str:
    """Trajectories for the round: "ready", "skip" (already published) or "wait" (live: not enough yet)."""
    state = RunState.load(settings.runs_dir, run_id)
    if state.next_round > round_index:
        return "skip"
    out = round_dir(settings, run_id, round_index) / "rollouts.json"
    if out.exists():
        return "ready"
    config = state.config
    if config.source == "live":
        return collect_live(settings, state, round_index, out)
    items = round_items(config, settings.qa_file(config.dataset), round_index)
    write_json_atomic(out.with_name("items.json"), items)
    r = _redis(settings)
    tag = rollout_tag(run_id, round_index)
    # A retried round first re-claims what the last attempt left pending.
    try:
        entries = take_from_stream(r, settings.trajectory_stream, run_id, tag, expected=set(), timeout_s=0)
    except RuntimeError:
        entries = []
    expected = {rec.id for _, rec in entries if rec.run_id == tag}
    if len(expected) < len(items) * config.algo.group_size:
        with PolicyClient(settings.policy_url, timeout=settings.task_time_limit_s) as client:
            expected = set(request_rollouts(client, config, items, round_index))
        entries = take_from_stream(r, settings.trajectory_stream, run_id, tag, expected)
    save_round_rollouts(out, entries)
    return "ready"


def fresh_versions(state: RunState) -> set[str]:
    """The policy versions a live trajectory may come from: the newest `max_staleness + 1` of this run."""
    versions = [state.initial_policy_version] + [p.policy_version for p in state.published if p.policy_version]
    return set(versions[-(state.config.max_staleness + 1) :])


def collect_live(settings: TrainerSettings, state: RunState, round_index: int, out) -> str:
    run_id = state.config.run_id
    entries, dropped = take_live(_redis(settings), settings.feedback_stream, run_id, state.config.live_batch,
                                 fresh_versions(state))  # fmt: skip
    if dropped:
        log.info("run %s: dropped %d stale or unrewarded live trajectories", run_id, dropped)
    if len(entries) < state.config.live_batch:
        return "wait"  # they stay pending for this run's group and are re-claimed on the next look
    write_json_atomic(out.with_name("items.json"), [])
    save_round_rollouts(out, entries)
    return "ready"


def _fetch_docs(settings: TrainerSettings, ids: set[str]) -> dict[str, tuple[str, str]]:
    docs = {}
    with RetrieverClient(settings.retriever_url) as client:
        for doc_id in sorted(ids):
            doc = client.get_document(doc_id)
            docs[doc_id] = (doc.title, doc.text)
    return docs


def train(settings: TrainerSettings, run_id: str, round_index: int) -> bool:
    state = RunState.load(settings.runs_dir, run_id)
    if state.next_round > round_index:
        return False
    folder = round_dir(settings, run_id, round_index)
    out = folder / "trained.json"
    if out.exists():
        return True
    cfg = state.config.algo
    started = time.perf_counter()
    entry_ids, records = load_round_rollouts(folder / "rollouts.json")
    policy = PolicyModel(
        settings.base_policy_dir, state.policy_adapter and _path(state.policy_adapter), cfg.lora_rank, cfg.lora_alpha
    )
    retriever = RetrieverModel(settings.base_retriever_dir, state.retriever_weights and _path(state.retriever_weights))
    candidate_ids = {str(c["id"]) for r in records for t in r.turns if t.search for c in t.search.candidates}
    live = state.config.source == "live"
    baseline = (state.reward_baseline if state.reward_baseline is not None else 0.0) if live else None
    batch = build_batch(records, cfg.model_copy(update={"seed": cfg.seed + round_index}), policy.tokenizer,
                        _fetch_docs(settings, candidate_ids), baseline=baseline)  # fmt: skip
    if live:
        batch.sequence_weights = importance_weights(policy, records, cfg.weight_clip)
    stats = train_round(policy, retriever, batch, cfg, state.lam)

    root = settings.checkpoint_root
    meta = {"algorithm": cfg.algo, "round": round_index}
    result = {"stats": stats, "retriever": None, "policy": None}
    if cfg.updates_retriever:
        version = retriever_version(run_id, round_index)
        write_retriever(root, retriever, version, state.retriever_version, metrics=_floats(stats), **meta)
        result["retriever"] = version
    if cfg.updates_policy:
        version = policy_version(run_id, round_index)
        write_policy(root, policy, version, state.policy_version, metrics=_floats(stats), **meta)
        result["policy"] = version
    items = json.loads((folder / "items.json").read_text())
    result["rollout_metrics"] = rollout_metrics(records, items)
    result["time/train_s"] = time.perf_counter() - started
    result["memory/peak_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    result["entry_ids"] = entry_ids
    write_json_atomic(out, result)
    return True


def importance_weights(policy: PolicyModel, records, clip: float):
    """Truncated per-trajectory weights min(clip, pi_theta / pi_behaviour) (geometric mean over generated
    tokens): live trajectories may come from an older policy version than the one being trained."""
    import torch

    weights = []
    with torch.no_grad():
        for record in records:
            mask = record.generated_mask
            if 1 not in mask:
                weights.append(1.0)
                continue
            start = mask.index(1)
            current = policy.token_logps(record.token_ids, start)[torch.tensor(mask[start:], dtype=torch.bool)]
            behaviour = torch.tensor([lp for t in record.turns for lp in t.generated_logprobs])
            weights.append(min(clip, float((current - behaviour).mean().exp())))
    return torch.tensor(weights)


def _path(value: str):
    from pathlib import Path

    return Path(value)


def _floats(stats: dict) -> dict[str, float]:
    return {k: float(v) for k, v in stats.items()}


def rollout_metrics(records, items: list[dict]) -> dict[str, float]:
    support = {str(i["id"]): set((i.get("metadata") or {}).get("supporting_doc_ids", [])) for i in items}
    recalls = []
    for r in records:
        gold = support.get(r.item_id or "", set())
        if gold:
            shown = {d for t in r.turns if t.search for d in t.search.chosen_ids}
            recalls.append(len(gold & shown) / len(gold))
    return {
        "reward/mean": float(np.mean([r.reward or 0.0 for r in records])),
        "em/mean": float(np.mean([r.em or 0.0 for r in records])),
        "f1/mean": float(np.mean([r.f1 or 0.0 for r in records])),
        "recall/support": float(np.mean(recalls)) if recalls else float("nan"),
        "searches/mean": float(np.mean([sum(1 for t in r.turns if t.search) for r in records])),
    }


def publish(settings: TrainerSettings, run_id: str, round_index: int) -> bool:
    """Retriever first, then policy; then acknowledge the round's trajectories and advance the run."""
    state = RunState.load(settings.runs_dir, run_id)
    if state.next_round > round_index:
        return state.status == "running"
    folder = round_dir(settings, run_id, round_index)
    trained = json.loads((folder / "trained.json").read_text())
    token = settings.resolve_admin_token()
    activated_at = {}
    if trained["retriever"]:
        with RetrieverClient(settings.retriever_url, admin_token=token, timeout=600) as client:
            client.register(trained["retriever"])
            client.activate(trained["retriever"])
        activated_at["retriever"] = time.time()
        state.retriever_version = trained["retriever"]
        state.retriever_weights = str(settings.checkpoint_root / trained["retriever"] / "query_encoder.safetensors")
    if trained["policy"]:
        with PolicyClient(settings.policy_url, admin_token=token, timeout=600) as client:
            client.register(trained["policy"])
            client.activate(trained["policy"])
        activated_at["policy"] = time.time()
        state.policy_version = trained["policy"]
        state.policy_adapter = str(settings.checkpoint_root / trained["policy"])
    r = _redis(settings)
    if trained["entry_ids"]:
        r.xack(settings.trajectory_stream, group_name(run_id), *trained["entry_ids"])
    stats = trained["stats"]
    append_metrics(settings.runs_dir, run_id, {
        "round": round_index, **trained["rollout_metrics"], **stats,
        "retriever_version": trained["retriever"], "policy_version": trained["policy"],
        "activated_at": activated_at, "time/train_s": trained["time/train_s"],
        "memory/peak_mb": trained["memory/peak_mb"],
    })  # fmt: skip
    state.published.append(
        Published(round=round_index, retriever_version=trained["retriever"], policy_version=trained["policy"])
    )
    state.lam = stats.get("lambda_next", state.lam)
    if state.config.source == "live":
        mean_reward = trained["rollout_metrics"]["reward/mean"]
        decay = state.config.baseline_decay
        previous = state.reward_baseline
        state.reward_baseline = mean_reward if previous is None else decay * previous + (1 - decay) * mean_reward
    state.next_round = round_index + 1
    if state.next_round >= state.config.rounds:
        state.status = "done"
    state.save(settings.runs_dir)
    return state.status == "running"


def mark_failed(settings: TrainerSettings, run_id: str, error: str) -> None:
    state = RunState.load(settings.runs_dir, run_id)
    state.status, state.error = "failed", error[:2000]
    state.save(settings.runs_dir)
