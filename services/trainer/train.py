"""The train step: the round's optimisation (`algo/`), its checkpoints and the optimizers' state."""

from __future__ import annotations

import json
import logging
import resource
import time
from pathlib import Path

from services.common.checkpoints import write_json_atomic
from services.common.clients.retriever import RetrieverClient
from services.trainer.algo.batch import RoundBatch, build_batch
from services.trainer.algo.optim import RoundOptimizers
from services.trainer.algo.round import (
    Coupling,
    retriever_unchanged_reason,
    train_policy_phase,
    train_retriever_phase,
    train_round,
)
from services.trainer.checkpoint import policy_version, retriever_version, write_policy, write_retriever
from services.trainer.device import Placement
from services.trainer.metrics import rollout_metrics, share_on_version
from services.trainer.models import PolicyModel, RetrieverModel
from services.trainer.plan import Phase
from services.trainer.rollout import (
    load_round_rollouts,
    rollout_tag,
)
from services.trainer.round_files import OPTIMIZER_DIR, TRAINED, rollouts_file, round_dir
from services.trainer.run_state import RunState
from services.trainer.settings import TrainerSettings

log = logging.getLogger(__name__)


def _fetch_docs(settings: TrainerSettings, ids: set[str]) -> dict[str, tuple[str, str]]:
    with RetrieverClient(settings.retriever_url) as client:
        return {i: (d.title, d.text) for i, d in client.get_documents(sorted(ids)).items()}


def train(settings: TrainerSettings, run_id: str, round_index: int, phase: Phase = "round") -> bool:
    """The round's optimisation: the whole round ("round"), or a fresh round's retriever or policy half, on the
    configured device (`settings.device`, `settings.precision`)."""
    state = RunState.load(settings.runs_dir, run_id)
    if state.next_round > round_index:
        return False
    folder = round_dir(settings, run_id, round_index)
    out = folder / TRAINED[phase]
    if out.exists():
        return True
    placement = Placement.resolve(settings.device, settings.precision)
    log.info("run %s round %d (%s) on %s", run_id, round_index, phase, placement.describe())
    with placement.scope():
        _train(settings, state, run_id, round_index, phase, placement, out)
    return True


def _train(settings: TrainerSettings, state: RunState, run_id: str, round_index: int, phase: Phase,
           placement: Placement, out: Path) -> None:  # fmt: skip
    folder = out.parent
    cfg = state.config.algo
    started = time.perf_counter()
    entry_ids, records = load_round_rollouts(folder / "rollouts.json")
    policy = PolicyModel(
        settings.base_policy_dir, state.policy_adapter and Path(state.policy_adapter), cfg.lora_rank, cfg.lora_alpha,
        seed=cfg.seed, placement=placement,
    )  # fmt: skip
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
            **({"retriever_unchanged": first["retriever_unchanged"]} if "retriever_unchanged" in first else {}),
            "policy_step/rollouts": rollout_tag(run_id, round_index, "fresh"),
            "policy_step/trajectories": [r.id for r in fresh.records],
            "fresh_metrics": {**rollout_metrics(fresh_records, items),
                              "on_adapted_retriever": share_on_version(fresh_records, first["retriever"])},
        })  # fmt: skip
    else:
        retriever = RetrieverModel(
            settings.base_retriever_dir, state.retriever_weights and Path(state.retriever_weights),
            params=cfg.retriever_params, lora_rank=cfg.retriever_lora_rank, lora_alpha=cfg.retriever_lora_alpha,
            seed=cfg.seed, encoder_overrides=settings.encoder_overrides, placement=placement,
        )  # fmt: skip
        if phase == "retriever":
            stats, coupling = train_retriever_phase(policy, retriever, batch, cfg, state.lam, optim)
            result["coupling"] = dump_coupling(coupling)
        else:
            stats = train_round(policy, retriever, batch, cfg, state.lam, optim)
        if unchanged := retriever_unchanged_reason(batch, cfg):
            # phi took no step: publishing it would be a new version identical to the one serving now
            result["retriever_unchanged"] = unchanged
            log.info("run %s round %d: retriever: unchanged, %s", run_id, round_index, unchanged)
        elif cfg.updates_retriever:
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
    result["device"] = placement.describe()
    if placement.device.type == "cuda":
        import torch

        result["memory/gpu_peak_mb"] = torch.cuda.max_memory_allocated(placement.device) / 2**20
    write_json_atomic(out, result)


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


def _floats(stats: dict) -> dict[str, float]:
    return {k: float(v) for k, v in stats.items()}
