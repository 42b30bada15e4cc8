"""The publish step: the promotion gate when the run has one (services/trainer/gate.py), then retriever first,
policy second; then the round's trajectories are acknowledged and the run advances."""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path

from services.common.checkpoints import write_json_atomic
from services.common.clients.policy import PolicyClient
from services.common.clients.retriever import RetrieverClient
from services.trainer.collect import run_versions
from services.trainer.gate import GateDecision, judge
from services.trainer.plan import Phase
from services.trainer.rollout import drop_group, group_name
from services.trainer.round_files import (
    OPTIMIZER_DIR,
    PUBLISHED_RETRIEVER,
    TRAINED,
    redis_client,
    round_dir,
    source_stream,
)
from services.trainer.run_state import HeldBack, Published, RunState, append_metrics
from services.trainer.settings import TrainerSettings
from services.trainer.trackers import log_round

log = logging.getLogger(__name__)


def publish_retriever(settings: TrainerSettings, folder: Path, version: str) -> float:
    """Register and activate the round's query tower, once per round; returns when it went live."""
    marker = folder / PUBLISHED_RETRIEVER
    if marker.exists() and (done := json.loads(marker.read_text()))["version"] == version:
        return done["activated_at"]
    with RetrieverClient(settings.retriever_url, admin_token=settings.services_admin_token(), timeout=600) as client:
        client.register(version)
        client.activate(version)
    activated_at = time.time()
    write_json_atomic(marker, {"version": version, "activated_at": activated_at})
    return activated_at


def activate(settings: TrainerSettings, state: RunState, folder: Path, trained: dict) -> dict[str, float]:
    """Retriever first, then policy; the run's state takes the new versions (saved by the caller). Returns when
    each went live."""
    activated_at = {}
    if trained["retriever"]:
        activated_at["retriever"] = publish_retriever(settings, folder, trained["retriever"])
        state.retriever_version = trained["retriever"]
        state.retriever_weights = str(settings.checkpoint_root / trained["retriever"] / "query_encoder.safetensors")
    if trained["policy"]:
        with PolicyClient(settings.policy_url, admin_token=settings.services_admin_token(), timeout=600) as client:
            client.register(trained["policy"])
            client.activate(trained["policy"])
        activated_at["policy"] = time.time()
        state.policy_version = trained["policy"]
        state.policy_adapter = str(settings.checkpoint_root / trained["policy"])
    return activated_at


def gate_round(settings: TrainerSettings, state: RunState, folder: Path, trained: dict) -> GateDecision:
    """Register the round's checkpoints (not activated), then let the gate judge them against the serving pair."""
    token = settings.services_admin_token()
    if trained["retriever"]:
        with RetrieverClient(settings.retriever_url, admin_token=token, timeout=600) as client:
            client.register(trained["retriever"])
    if trained["policy"]:
        with PolicyClient(settings.policy_url, admin_token=token, timeout=600) as client:
            client.register(trained["policy"])
    serving = run_versions(state)
    candidate = (trained["policy"] or serving[0], trained["retriever"] or serving[1])
    serving_adapter = Path(state.policy_adapter) if state.policy_adapter else None
    weights = {
        "serving": serving_adapter,
        "candidate": settings.checkpoint_root / trained["policy"] if trained["policy"] else serving_adapter,
    }
    return judge(settings, state.config, folder, serving, candidate, weights)


def publish(settings: TrainerSettings, run_id: str, round_index: int, phase: Phase = "round") -> bool:
    """Retriever first, then policy; then acknowledge the round's trajectories (both collections of a fresh
    round) and advance the run. A fresh round's retriever half only activates the retriever."""
    state = RunState.load(settings.runs_dir, run_id)
    if state.next_round > round_index:
        return phase != "retriever" and state.status == "running"
    folder = round_dir(settings, run_id, round_index)
    if phase == "retriever":
        if version := json.loads((folder / TRAINED["retriever"]).read_text())["retriever"]:
            publish_retriever(settings, folder, version)
        return True
    trained = json.loads((folder / TRAINED[phase]).read_text())
    gate = gate_round(settings, state, folder, trained) if state.config.gate.canary else None
    accepted = gate is None or gate.accepted
    activated_at = activate(settings, state, folder, trained) if accepted else {}
    r = redis_client(settings)
    if trained["entry_ids"]:
        # On the stream they came from: a live round's stay pending on the feedback stream otherwise, and the
        # next round claims the same trajectories again.
        r.xack(source_stream(settings, state.config), group_name(run_id), *trained["entry_ids"])
    stats = trained["stats"]
    fresh = {f"fresh/{k}": v for k, v in trained.get("fresh_metrics", {}).items()}
    requested_at = {name: json.loads(path.read_text())["requested_at"]
                    for name in ("first", "fresh") if (path := folder / f"requested-{name}.json").exists()}  # fmt: skip
    row = {
        "round": round_index, **trained["rollout_metrics"], **stats, **fresh,
        "retriever_version": trained["retriever"] if accepted else None,
        "policy_version": trained["policy"] if accepted else None,
        **({} if gate is None else gate.row()),
        **({} if accepted else {"rejected/retriever_version": trained["retriever"],
                                "rejected/policy_version": trained["policy"]}),
        **({"retriever_unchanged": trained["retriever_unchanged"]} if "retriever_unchanged" in trained else {}),
        "activated_at": activated_at, "requested_at": requested_at, "time/train_s": trained["time/train_s"],
        "memory/peak_mb": trained["memory/peak_mb"],
        **({"memory/gpu_peak_mb": trained["memory/gpu_peak_mb"]} if "memory/gpu_peak_mb" in trained else {}),
        "policy_rollouts": trained["policy_rollouts"],
        "policy_step/rollouts": trained["policy_step/rollouts"],
        "policy_step/trajectories": len(trained["policy_step/trajectories"]),
    }  # fmt: skip
    append_metrics(settings.runs_dir, run_id, row)
    if accepted:
        state.published.append(
            Published(round=round_index, retriever_version=trained["retriever"], policy_version=trained["policy"])
        )
        state.lam = stats.get("lambda_next", state.lam)
        if (folder / OPTIMIZER_DIR).exists():
            state.optimizer_dir = str(folder / OPTIMIZER_DIR)
    else:  # the next round starts from the serving weights, their optimizer state and their lambda
        state.rejected.append(HeldBack(round=round_index, retriever_version=trained["retriever"],
                                       policy_version=trained["policy"], reason=gate.reason))  # fmt: skip
        log.warning("run %s round %d: the gate kept its checkpoints back: %s", run_id, round_index, gate.reason)
    if state.config.source == "live":
        mean_reward = trained["rollout_metrics"]["reward/mean"]
        decay = state.config.baseline_decay
        previous = state.reward_baseline
        state.reward_baseline = mean_reward if previous is None else decay * previous + (1 - decay) * mean_reward
    state.next_round = round_index + 1
    if state.next_round >= state.config.rounds:
        state.status = "done"
    state.save(settings.runs_dir)
    if state.status == "done":  # nothing left to read: the group would only hold entries back from trimming
        drop_group(r, source_stream(settings, state.config), run_id)
    # After the save: a tracker that fails is a warning, and one that takes the process down cannot log the row twice
    log_round(settings.runs_dir / run_id, state.config.model_dump(mode="json"), row, finished=state.status == "done")
    return state.status == "running"
