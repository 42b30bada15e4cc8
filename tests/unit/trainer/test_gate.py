"""The promotion gate: its rule, the canary held out of training, and what publish does with a rejected round
(checkpoints kept back, the run going on from its last accepted state, the round's trajectories acknowledged)."""

from __future__ import annotations

import json
import os
import uuid

import pytest

from services.data.split import EVAL_SPLIT
from services.trainer import publish as publish_step
from services.trainer.gate import GATE_FILE, GateDecision, decide
from services.trainer.round_files import canary_questions, round_dir, run_questions
from services.trainer.run_state import GateConfig, RunConfig, RunState, read_metrics
from services.trainer.settings import TrainerSettings


def test_the_rule_rejects_a_drop_past_the_margin_or_a_significant_loss_and_accepts_the_rest():
    gate = GateConfig(canary=20, max_em_drop=0.05, alpha=0.05)
    serving = {f"q{i}": float(i < 10) for i in range(20)}  # EM 0.5
    same = dict(serving)
    assert decide(serving, same, gate)[0] is True
    dropped = {**serving, "q0": 0.0, "q1": 0.0}  # 0.4: 0.1 below, past 0.05
    accepted, why, numbers = decide(serving, dropped, gate)
    assert accepted is False and "0.100 below" in why and numbers["worse"] == 2
    # within a generous margin, but worse on 8 questions and better on none: the sign test rejects (p = 0.0078)
    worse = {**serving, **{f"q{i}": 0.0 for i in range(8)}}
    accepted, why, numbers = decide(serving, worse, GateConfig(canary=20, max_em_drop=1.0, alpha=0.05))
    assert accepted is False and "sign test" in why and numbers["p"] == pytest.approx(2 / 2**8)
    better = {**serving, **{f"q{i}": 1.0 for i in range(10, 14)}}
    assert decide(serving, better, gate)[0] is True
    # where neither pair answers, the gold answer's log-probability still tells a collapse from no change
    accepted, why, numbers = decide(serving, same, gate, logprobs=(-2.0, -6.5))
    assert accepted is False and "fell 4.50 nats" in why and numbers["logprob_candidate"] == -6.5
    assert decide(serving, same, gate, logprobs=(-2.0, -2.6))[0] is True  # within max_logprob_drop (1 nat)
    assert decide(serving, same, GateConfig(canary=20, max_logprob_drop=None), logprobs=(-2.0, -9.0))[0] is True


def write_pool(qa_dir, dataset: str, n: int) -> None:
    qa_dir.mkdir(parents=True, exist_ok=True)
    rows = [{"id": f"{dataset}-{i}", "question": f"q{i}?", "golden_answers": [f"a{i}"]} for i in range(n)]
    (qa_dir / f"{dataset}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))


def test_the_canary_is_the_pools_first_questions_and_never_trained_on(tmp_path):
    write_pool(tmp_path / "qa", "hotpotqa", EVAL_SPLIT + 30)
    settings = TrainerSettings(data_dir=tmp_path / "data", qa_dir=tmp_path / "qa")
    config = RunConfig(run_id="g", dataset="hotpotqa", gate=GateConfig(canary=8))
    canary = [row["id"] for row in canary_questions(settings, config)]
    assert canary == [f"hotpotqa-{EVAL_SPLIT + i}" for i in range(8)]  # after the evaluation split, in file order
    trained = {row["id"] for row in run_questions(settings, config)}
    assert len(trained) == 22 and not trained & set(canary)
    assert len(run_questions(settings, config.model_copy(update={"gate": GateConfig()}))) == 30  # no gate: all
    with pytest.raises(ValueError, match="too few for a canary"):
        canary_questions(settings, RunConfig(run_id="g", dataset="hotpotqa", gate=GateConfig(canary=30)))


def test_a_gate_is_refused_where_it_cannot_judge():
    with pytest.raises(ValueError, match="activates the retriever mid-round"):
        RunConfig(gate=GateConfig(canary=8), algo={"policy_rollouts": "fresh"})
    with pytest.raises(ValueError, match="gate.dataset"):
        RunConfig(source="live", gate=GateConfig(canary=8))
    assert RunConfig(source="live", gate=GateConfig(canary=8, dataset="nq")).canary_dataset == "nq"


def test_a_rejected_round_keeps_its_checkpoints_back_and_the_run_goes_on_from_the_last_accepted(tmp_path, monkeypatch):
    """Real Redis for the acknowledgement; the services' calls are what the gate and activation would make, here
    recorded: a rejected round activates nothing."""
    import redis

    from services.trainer.rollout import ensure_group, group_name

    url = os.environ.get("BRIDGE_TEST_REDIS_URL", "redis://127.0.0.1:6379/0")
    stream = f"test:trajectories:{uuid.uuid4().hex}"
    monkeypatch.setenv("BRIDGE_TRAINER_TRAJECTORY_STREAM", stream)
    monkeypatch.setenv("REDIS_URL", url)
    settings = TrainerSettings(data_dir=tmp_path / "data")
    config = RunConfig(run_id=f"gate-{uuid.uuid4().hex[:6]}", rounds=3, gate=GateConfig(canary=8), report_to=[])
    state = RunState(config=config, lam=0.02, next_round=1, policy_version="r0-policy", retriever_version="r0-ret",
                     policy_adapter="/ck/r0-policy", optimizer_dir="/runs/round-0000/optimizer")  # fmt: skip
    state.save(settings.runs_dir)
    r = redis.Redis.from_url(url, decode_responses=True)
    ensure_group(r, stream, config.run_id)
    entry = r.xadd(stream, {"data": "{}"})
    r.xreadgroup(group_name(config.run_id), "worker", {stream: ">"})
    folder = round_dir(settings, config.run_id, 1)
    folder.mkdir(parents=True, exist_ok=True)
    trained = {"retriever": "r1-ret", "policy": "r1-policy", "entry_ids": [entry], "stats": {"lambda_next": 0.5},
               "rollout_metrics": {"reward/mean": 0.25}, "time/train_s": 1.0, "memory/peak_mb": 1.0,
               "policy_rollouts": "reweighted", "policy_step/rollouts": 4, "policy_step/trajectories": []}  # fmt: skip
    (folder / "trained.json").write_text(json.dumps(trained))
    (folder / "optimizer").mkdir()
    decision = GateDecision(accepted=False, reason="canary EM 0.100 is 0.300 below the serving pair's 0.400",
                            serving=("r0-policy", "r0-ret"), candidate=("r1-policy", "r1-ret"), canary=8,
                            em_serving=0.4, em_candidate=0.1, better=0, worse=3, p=0.25, seconds=2.0)  # fmt: skip
    calls = []
    monkeypatch.setattr(publish_step, "gate_round", lambda *a: calls.append("gate") or decision)
    monkeypatch.setattr(publish_step, "activate", lambda *a: calls.append("activate") or {})
    try:
        assert publish_step.publish(settings, config.run_id, 1) is True  # the run goes on
        assert calls == ["gate"]  # nothing activated
        after = RunState.load(settings.runs_dir, config.run_id)
        assert (after.next_round, after.policy_version, after.retriever_version) == (2, "r0-policy", "r0-ret")
        assert (after.policy_adapter, after.optimizer_dir, after.lam) == (
            "/ck/r0-policy", "/runs/round-0000/optimizer", 0.02)  # fmt: skip
        assert [(x.round, x.policy_version, x.retriever_version) for x in after.rejected] == [
            (1, "r1-policy", "r1-ret")
        ]
        [row] = read_metrics(settings.runs_dir, config.run_id)
        assert row["gate/accepted"] == 0.0 and row["policy_version"] is None
        assert row["rejected/policy_version"] == "r1-policy" and "0.300 below" in row["gate/reason"]
        assert r.xpending(stream, group_name(config.run_id))["pending"] == 0  # used, acknowledged
    finally:
        r.delete(stream)


def test_a_decision_is_made_once_per_round(tmp_path):
    """A redelivered publish finds <round>/gate.json and decides the same, without scoring again."""
    from services.trainer.gate import judge

    settings = TrainerSettings(data_dir=tmp_path / "data")
    folder = tmp_path / "round-0001"
    folder.mkdir()
    kept = GateDecision(accepted=True, reason="kept", serving=("a", "b"), candidate=("c", "d"), canary=4,
                        em_serving=0.5, em_candidate=0.5, better=0, worse=0, p=1.0, seconds=1.0)  # fmt: skip
    (folder / GATE_FILE).write_text(kept.model_dump_json())
    assert judge(settings, RunConfig(gate=GateConfig(canary=4)), folder, ("a", "b"), ("c", "d")) == kept
