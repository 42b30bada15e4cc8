"""A round happens once, whatever Celery redelivers (acks_late): the next step is enqueued once per run (a mark in
the real Redis), and a publish's metrics row is written once."""

from __future__ import annotations

import uuid

from services.trainer import tasks
from services.trainer.run_state import RunConfig, RunState, append_metrics, read_metrics
from services.trainer.settings import TrainerSettings


def test_a_redelivered_step_enqueues_the_next_one_once(tmp_path, monkeypatch):
    monkeypatch.setenv("BRIDGE_DATA_DIR", str(tmp_path / "data"))
    settings = TrainerSettings()
    config = RunConfig(run_id=f"chain-{uuid.uuid4().hex[:6]}", rounds=3)
    (settings.runs_dir / config.run_id).mkdir(parents=True)
    RunState(config=config, lam=0.02).save(settings.runs_dir)
    sent = []
    for name in ("collect", "train", "publish"):
        monkeypatch.setattr(getattr(tasks, name), "delay", lambda *a, name=name: sent.append((name, *a)))
    for _ in range(2):  # the publish of round 0, then the same message redelivered
        tasks._then(settings, config.run_id, 0, "publish", "round")
    assert sent == [("collect", config.run_id, 1, "round")]
    tasks._then(settings, config.run_id, 1, "collect", "round")
    assert sent[-1] == ("train", config.run_id, 1, "round") and len(sent) == 2
    # the same run id started again (its folder removed): another chain, enqueued afresh
    RunState(config=config, lam=0.02).save(settings.runs_dir)
    tasks._then(settings, config.run_id, 0, "publish", "round")
    assert len(sent) == 3


def test_a_round_writes_its_metrics_row_once(tmp_path):
    (tmp_path / "run").mkdir()
    assert append_metrics(tmp_path, "run", {"round": 0, "reward/mean": 0.5}) is True
    assert append_metrics(tmp_path, "run", {"round": 0, "reward/mean": 0.5}) is False  # a redelivered publish
    assert append_metrics(tmp_path, "run", {"round": 1, "reward/mean": 0.25}) is True
    assert [r["round"] for r in read_metrics(tmp_path, "run")] == [0, 1]


def test_a_message_redelivered_past_the_bound_fails_the_run_with_the_reason(tmp_path, monkeypatch):
    """acks_late requeues a step whose worker was lost; one killed for memory would come back forever. The same
    message (task id, retry count) delivered more than `max_redeliveries` + 1 times fails the run instead."""
    monkeypatch.setenv("BRIDGE_DATA_DIR", str(tmp_path / "data"))
    monkeypatch.setenv("BRIDGE_TRAINER_MAX_REDELIVERIES", "1")
    settings = TrainerSettings()
    config = RunConfig(run_id=f"lost-{uuid.uuid4().hex[:6]}", rounds=3)
    (settings.runs_dir / config.run_id).mkdir(parents=True)
    RunState(config=config, lam=0.02, next_round=1).save(settings.runs_dir)  # round 0 published: the body is cheap
    ran = []
    monkeypatch.setattr(tasks.publish_step, "publish", lambda *a: ran.append(a) and False)
    task_id = uuid.uuid4().hex
    for _ in range(2):
        tasks.publish.apply(args=(config.run_id, 0), task_id=task_id)
    assert len(ran) == 2 and RunState.load(settings.runs_dir, config.run_id).status == "running"
    tasks.publish.apply(args=(config.run_id, 0), task_id=task_id)  # the third delivery of one message
    state = RunState.load(settings.runs_dir, config.run_id)
    assert len(ran) == 2 and state.status == "failed" and "delivered 3 times" in state.error
    tasks.publish.apply(args=(config.run_id, 0), task_id=uuid.uuid4().hex)  # another message runs
    assert len(ran) == 3
