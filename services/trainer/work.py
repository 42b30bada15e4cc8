"""What the Celery tasks do, as plain functions keyed by (run_id, round) and safe to repeat."""

from __future__ import annotations

import json
import logging
import resource
import time
from pathlib import Path

import numpy as np
import redis

from services.common.checkpoints import write_json_atomic
from services.common.clients.policy import PolicyClient
from services.common.clients.retriever import RetrieverClient
from services.trainer import plan
from services.trainer.algo.batch import RoundBatch, build_batch
from services.trainer.algo.optim import RoundOptimizers
from services.trainer.algo.round import Coupling, train_policy_phase, train_retriever_phase, train_round
from services.trainer.checkpoint import policy_version, retriever_version, write_policy, write_retriever
from services.trainer.config_file import to_toml
from services.trainer.models import PolicyModel, RetrieverModel
from services.trainer.plan import Phase
from services.trainer.rollout import (
    complete_groups,
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


def collect(settings: TrainerSettings, run_id: str, round_index: int, phase: Phase = "round") -> str:
    """Trajectories for the round: "ready", "skip" (already published) or "wait" (live: not enough yet).

    The policy phase of a fresh round asks the same questions again, after its retriever went live."""
    state = RunState.load(settings.runs_dir, run_id)
    if state.next_round > round_index:
        return "skip"
    folder = round_dir(settings, run_id, round_index)
    name = plan.collection(phase)
    out = folder / rollouts_file(name)
    if out.exists():
        return "ready"
    config = state.config
    if config.source == "live":
        return collect_live(settings, state, round_index, out)
    if name:
        if not (folder / PUBLISHED_RETRIEVER).exists():
            raise RuntimeError(f"round {round_index}: fresh rollouts before the round's retriever is published")
        items = json.loads((folder / "items.json").read_text())
    else:
        items = round_items(config, settings.qa_file(config.dataset), round_index)
        write_json_atomic(folder / "items.json", items)
    r = _redis(settings)
    tag = rollout_tag(run_id, round_index, name)
    # A retried step first takes what the last attempt left in the stream, and asks again only if that is
    # not a full set of groups (the superseded entries are acknowledged as the new ones are read).
    recovered = take_from_stream(r, settings.trajectory_stream, run_id, tag, expected=None)
    entries, leftover = complete_groups(recovered, items, config.algo.group_size)
    if entries:
        if leftover:
            r.xack(settings.trajectory_stream, group_name(run_id), *leftover)
    else:
        write_json_atomic(folder / f"requested-{name or 'first'}.json", {"tag": tag, "requested_at": time.time()})
        with PolicyClient(settings.policy_url, settings.resolve_admin_token(), settings.task_time_limit_s) as client:
            expected = set(request_rollouts(client, config, items, round_index, name))
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
    with RetrieverClient(settings.retriever_url) as client:
        return {i: (d.title, d.text) for i, d in client.get_documents(sorted(ids)).items()}


OPTIMIZER_DIR = "optimizer"
TRAINED = {"round": "trained.json", "retriever": "trained-retriever.json", "policy": "trained.json"}
PUBLISHED_RETRIEVER = "published-retriever.json"


def train(settings: TrainerSettings, run_id: str, round_index: int, phase: Phase = "round") -> bool:
    """The round's optimisation: the whole round ("round"), or a fresh round's retriever or policy half."""
    state = RunState.load(settings.runs_dir, run_id)
    if state.next_round > round_index:
        return False
    folder = round_dir(settings, run_id, round_index)
    out = folder / TRAINED[phase]
    if out.exists():
        return True
    cfg = state.config.algo
    started = time.perf_counter()
    entry_ids, records = load_round_rollouts(folder / "rollouts.json")
    policy = PolicyModel(
        settings.base_policy_dir, state.policy_adapter and _path(state.policy_adapter), cfg.lora_rank, cfg.lora_alpha
    )
    batch = _batch(settings, state, round_index, records, policy)
    items = json.loads((folder / "items.json").read_text())
    root = settings.checkpoint_root
    run_config = state.config.model_dump(mode="json")
    meta = {"algorithm": cfg.algo, "round": round_index, "extra": {"run_id": run_id, "config": run_config}}
    # The optimizers continue from the last published round's state; this round's goes to its own folder,
    # so a retried round starts again from the same state.
    optim = RoundOptimizers(cfg, state.config.rounds, state.optimizer_dir and Path(state.optimizer_dir))
    live = state.config.source == "live"
    result = {
        "retriever": None, "policy": None, "rollout_metrics": rollout_metrics(records, items), "entry_ids": entry_ids,
        "policy_rollouts": cfg.policy_rollouts,
        "policy_step/rollouts": "live" if live else rollout_tag(run_id, round_index),
        "policy_step/trajectories": [r.id for r in batch.records] if cfg.updates_policy else [],
    }  # fmt: skip
    train_s = 0.0
    if phase == "policy":
        first = json.loads((folder / TRAINED["retriever"]).read_text())
        fresh_ids, fresh_records = load_round_rollouts(folder / rollouts_file("fresh"))
        fresh = _batch(settings, state, round_index, fresh_records, policy, with_q=False)
        coupling = load_coupling(first["coupling"], batch, state.lam)
        stats = train_policy_phase(policy, fresh, cfg, state.lam, coupling, first["stats"], optim)
        train_s = first["time/train_s"]
        result.update({
            "retriever": first["retriever"], "entry_ids": entry_ids + fresh_ids,
            "policy_step/rollouts": rollout_tag(run_id, round_index, "fresh"),
            "policy_step/trajectories": [r.id for r in fresh.records],
            "fresh_metrics": {**rollout_metrics(fresh_records, items),
                              "on_adapted_retriever": share_on_version(fresh_records, first["retriever"])},
        })  # fmt: skip
    else:
        retriever = RetrieverModel(
            settings.base_retriever_dir, state.retriever_weights and _path(state.retriever_weights),
            params=cfg.retriever_params, lora_rank=cfg.retriever_lora_rank, lora_alpha=cfg.retriever_lora_alpha,
        )  # fmt: skip
        if phase == "retriever":
            stats, coupling = train_retriever_phase(policy, retriever, batch, cfg, state.lam, optim)
            result["coupling"] = dump_coupling(coupling)
        else:
            stats = train_round(policy, retriever, batch, cfg, state.lam, optim)
        if cfg.updates_retriever:
            version = retriever_version(run_id, round_index)
            write_retriever(root, retriever, version, state.retriever_version, metrics=_floats(stats), **meta)
            result["retriever"] = version
    if phase != "retriever" and cfg.updates_policy:
        version = policy_version(run_id, round_index)
        write_policy(root, policy, version, state.policy_version, metrics=_floats(stats), **meta)
        result["policy"] = version
    optim.save(folder / OPTIMIZER_DIR)
    result["stats"] = stats
    result["time/train_s"] = train_s + time.perf_counter() - started
    result["memory/peak_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    write_json_atomic(out, result)
    return True


def _batch(settings: TrainerSettings, state: RunState, round_index: int, records, policy: PolicyModel,
           with_q: bool = True) -> RoundBatch:  # fmt: skip
    cfg = state.config.algo
    live = state.config.source == "live"
    baseline = (state.reward_baseline if state.reward_baseline is not None else 0.0) if live else None
    candidate_ids = {str(c["id"]) for r in records for t in r.turns if t.search for c in t.search.candidates}
    docs = _fetch_docs(settings, candidate_ids) if with_q else {}
    # The seed depends on (seed, round) only, so the policy half rebuilds the retriever half's Q samples.
    return build_batch(records, cfg.model_copy(update={"seed": cfg.seed + round_index}), policy.tokenizer, docs,
                       baseline=baseline, with_q=with_q)  # fmt: skip


def dump_coupling(coupling: Coupling | None) -> dict | None:
    """What the policy half needs from the retriever half: log p_phi and log p_z on the Q samples, keyed by
    (search, candidates) so the rebuilt samples can be checked to be the same ones."""
    if coupling is None:
        return None
    return {
        "samples": [[q.search, q.candidates] for q in coupling.q_samples],
        "log_p_phi": coupling.log_p_phi.tolist(),
        "log_p_z": None if coupling.log_p_z is None else coupling.log_p_z.tolist(),
    }


def load_coupling(data: dict | None, batch: RoundBatch, lam: float) -> Coupling | None:
    import torch

    if data is None:
        return None
    if data["samples"] != [[q.search, q.candidates] for q in batch.q_samples]:
        raise RuntimeError("the rebuilt Q samples differ from those the retriever half was fit on")
    log_p_z = None if data["log_p_z"] is None else torch.tensor(data["log_p_z"])
    return Coupling(lam, batch.q_samples, torch.tensor(data["log_p_phi"]), log_p_z)


def share_on_version(records, version: str | None) -> float:
    """Share of the search steps that the given retriever version served (1.0 when there were none)."""
    steps = [t.search for r in records for t in r.turns if t.search]
    return sum(s.retriever_version == version for s in steps) / len(steps) if steps else 1.0


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


def publish_retriever(settings: TrainerSettings, folder: Path, version: str) -> float:
    """Register and activate the round's query tower, once per round; returns when it went live."""
    marker = folder / PUBLISHED_RETRIEVER
    if marker.exists() and (done := json.loads(marker.read_text()))["version"] == version:
        return done["activated_at"]
    with RetrieverClient(settings.retriever_url, admin_token=settings.resolve_admin_token(), timeout=600) as client:
        client.register(version)
        client.activate(version)
    activated_at = time.time()
    write_json_atomic(marker, {"version": version, "activated_at": activated_at})
    return activated_at


def publish(settings: TrainerSettings, run_id: str, round_index: int, phase: Phase = "round") -> bool:
    """Retriever first, then policy; then acknowledge the round's trajectories (both collections of a fresh
    round) and advance the run. A fresh round's retriever half only activates the retriever."""
    state = RunState.load(settings.runs_dir, run_id)
    if state.next_round > round_index:
        return phase != "retriever" and state.status == "running"
    folder = round_dir(settings, run_id, round_index)
    if phase == "retriever":
        publish_retriever(settings, folder, json.loads((folder / TRAINED["retriever"]).read_text())["retriever"])
        return True
    trained = json.loads((folder / TRAINED[phase]).read_text())
    token = settings.resolve_admin_token()
    activated_at = {}
    if trained["retriever"]:
        activated_at["retriever"] = publish_retriever(settings, folder, trained["retriever"])
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
    fresh = {f"fresh/{k}": v for k, v in trained.get("fresh_metrics", {}).items()}
    requested_at = {name: json.loads(path.read_text())["requested_at"]
                    for name in ("first", "fresh") if (path := folder / f"requested-{name}.json").exists()}  # fmt: skip
    append_metrics(settings.runs_dir, run_id, {
        "round": round_index, **trained["rollout_metrics"], **stats, **fresh,
        "retriever_version": trained["retriever"], "policy_version": trained["policy"],
        "activated_at": activated_at, "requested_at": requested_at, "time/train_s": trained["time/train_s"],
        "memory/peak_mb": trained["memory/peak_mb"], "policy_rollouts": trained["policy_rollouts"],
        "policy_step/rollouts": trained["policy_step/rollouts"],
        "policy_step/trajectories": len(trained["policy_step/trajectories"]),
    })  # fmt: skip
    state.published.append(
        Published(round=round_index, retriever_version=trained["retriever"], policy_version=trained["policy"])
    )
    state.lam = stats.get("lambda_next", state.lam)
    if (folder / OPTIMIZER_DIR).exists():
        state.optimizer_dir = str(folder / OPTIMIZER_DIR)
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
