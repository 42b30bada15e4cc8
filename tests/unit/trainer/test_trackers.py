"""Experiment trackers (`report_to`): each published round's metrics row goes to TensorBoard, W&B and MLflow under
the row's own names, read back here with each tracker's own reader; a tracker named and not installed is refused
when the run starts, in one line; a tracker that fails while logging is a warning, never the round's failure."""

from __future__ import annotations

import json
import logging
import struct
import sys
import uuid

import pytest
from typer.testing import CliRunner

from services.trainer.config_file import load_run_config, parse_override, to_toml
from services.trainer.round_files import start_run
from services.trainer.run_state import RunConfig
from services.trainer.settings import TrainerSettings
from services.trainer.trackers import TrackerUnavailable, log_round, split_row, tracker_names


def metrics_row(round_index: int) -> dict:
    """A round's row as publish.py appends it to metrics.jsonl (numbers, strings, None and nested timestamps)."""
    return {
        "round": round_index, "reward/mean": 0.25 + round_index, "em/mean": 0.5, "f1/mean": 0.625,
        "recall/support": float("nan"), "searches/mean": 1.5, "loss/policy": -0.125, "kl/mean": 0.01,
        "clip_ratio/mean": 0.0, "lambda": 0.02, "lambda_next": 0.02, "time/train_s": 12.5, "memory/peak_mb": 900.0,
        "retriever_version": f"bridge-r{round_index}", "policy_version": None, "policy_rollouts": "reweighted",
        "activated_at": {"retriever": 1.7e9}, "requested_at": {}, "policy_step/trajectories": 8,
    }  # fmt: skip


@pytest.fixture
def run(tmp_path, monkeypatch):
    """A run folder of a uniquely named run, with no tracker pointed elsewhere by the environment."""
    for name in ("WANDB_MODE", "WANDB_PROJECT", "MLFLOW_TRACKING_URI", "MLFLOW_EXPERIMENT_NAME",
                 "MLFLOW_ALLOW_FILE_STORE"):  # fmt: skip
        monkeypatch.delenv(name, raising=False)
    for name in ("WANDB_CONFIG_DIR", "WANDB_CACHE_DIR", "WANDB_DATA_DIR", "WANDB_ARTIFACT_DIR"):
        monkeypatch.setenv(name, str(tmp_path / "wandb-home"))
    run_id = f"trk-{uuid.uuid4().hex[:6]}"
    run_dir = tmp_path / "runs" / run_id
    run_dir.mkdir(parents=True)
    return run_id, run_dir


def test_without_the_trackers_extra_a_run_reports_to_none_by_default_and_refuses_tensorboard(monkeypatch):
    """tensorboard is the `trackers` extra, not a dependency of every service: where it is missing, the default
    names no tracker (a run starts) and a run that names it is refused in one line, with how to install it."""
    import importlib.util

    from services.trainer import trackers

    find_spec = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "tensorboard" else find_spec(name, *a)
    )
    monkeypatch.setitem(sys.modules, "tensorboard", None)  # so that importing it fails as on a plain install
    assert RunConfig().report_to == []
    with pytest.raises(
        trackers.TrackerUnavailable, match=r"tensorboard, not installed here: pip install 'bridge-rl\[trackers\]'"
    ):
        trackers.check_trackers(RunConfig(report_to="tensorboard").report_to)


def test_report_to_in_the_config_file_and_on_the_command_line(tmp_path):
    assert RunConfig().report_to == ["tensorboard"]
    assert RunConfig(report_to="wandb, mlflow,wandb").report_to == ["wandb", "mlflow"]
    assert RunConfig(report_to="none").report_to == [] and RunConfig(report_to=[]).report_to == []
    assert load_run_config(None, [parse_override("report_to=wandb,mlflow")]).report_to == ["wandb", "mlflow"]
    assert load_run_config(None, [parse_override("report_to=[]")]).report_to == []
    (tmp_path / "run.toml").write_text(to_toml(RunConfig(report_to=["tensorboard", "mlflow"])))
    assert 'report_to = ["tensorboard", "mlflow"]' in (tmp_path / "run.toml").read_text()
    assert load_run_config(tmp_path / "run.toml").report_to == ["tensorboard", "mlflow"]
    with pytest.raises(ValueError, match="report_to"):
        RunConfig(report_to=["tensorbored"])
    assert tracker_names(["tensorboard", "wandb,mlflow", "none"]) == ["tensorboard", "wandb", "mlflow"]


def test_tensorboard_event_files_hold_every_rounds_scalars(run):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    run_id, run_dir = run
    config = RunConfig(run_id=run_id)  # the default: tensorboard
    for round_index in range(2):  # one writer per round, as rounds publish from any worker: the same log dir
        log_round(run_dir, config.model_dump(mode="json"), metrics_row(round_index))
    events = EventAccumulator(str(run_dir / "tensorboard"))
    events.Reload()
    scalars, texts = split_row(metrics_row(0))
    assert set(events.Tags()["scalars"]) == set(scalars)
    assert [(e.step, e.value) for e in events.Scalars("reward/mean")] == [(0, 0.25), (1, 1.25)]
    assert [e.step for e in events.Scalars("time/train_s")] == [0, 1]
    assert {"retriever_version/text_summary", "policy_rollouts/text_summary"} <= set(events.Tags()["tensors"])
    texts = events.Tensors("retriever_version/text_summary")
    assert [(e.step, e.tensor_proto.string_val[0]) for e in texts] == [(0, b"bridge-r0"), (1, b"bridge-r1")]
    assert "activated_at" not in str(events.Tags()) and "policy_version" not in str(events.Tags())


def test_a_tracker_named_but_not_installed_is_refused_when_the_run_starts(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "wandb", None)  # as if not installed: `import wandb` raises ImportError
    settings = TrainerSettings(data_dir=tmp_path / "data")
    config = RunConfig(run_id=f"trk-{uuid.uuid4().hex[:6]}", report_to=["tensorboard", "wandb"])
    with pytest.raises(TrackerUnavailable) as refused:
        start_run(settings, config)
    message = str(refused.value)
    assert "\n" not in message and message.startswith("report_to names wandb, not installed here:")
    assert "bridge-rl[trackers]" in message
    assert not (settings.runs_dir / config.run_id).exists()  # nothing written, no round enqueued

    from services.cli.main import app

    monkeypatch.setenv("BRIDGE_DATA_DIR", str(tmp_path / "data"))
    result = CliRunner().invoke(app, ["train", "--report-to", "tensorboard,wandb", "--no-wait"],
                                env={"COLUMNS": "200"})  # fmt: skip
    assert result.exit_code == 2, result.output + repr(result.exception)
    assert result.output.strip().splitlines() == [f"error: {message}"]
    result = CliRunner().invoke(app, ["train", "--report-to", "tensorbored", "--print-config"],
                                env={"COLUMNS": "200"})  # fmt: skip
    assert result.exit_code == 2 and "tensorbored: not one of tensorboard, wandb, mlflow, none" in result.output
    result = CliRunner().invoke(app, ["train", "--report-to", "mlflow", "--report-to", "none", "--print-config"])
    assert result.exit_code == 0 and 'report_to = ["mlflow"]' in result.output


def test_the_worker_refuses_the_run_at_its_start_too(tmp_path, monkeypatch):
    """The workers may be another install than the command's: the run's first task checks again, there."""
    from services.trainer import tasks

    monkeypatch.setitem(sys.modules, "mlflow", None)
    monkeypatch.setenv("BRIDGE_DATA_DIR", str(tmp_path / "data"))
    settings = TrainerSettings()
    config = RunConfig(run_id=f"trk-{uuid.uuid4().hex[:6]}", report_to=["mlflow"])
    from services.trainer.run_state import RunState

    (settings.runs_dir / config.run_id).mkdir(parents=True)
    RunState(config=config, lam=0.02).save(settings.runs_dir)
    with pytest.raises(TrackerUnavailable, match="report_to names mlflow"):
        tasks.collect.run(config.run_id, 0)  # the task's body, in this process (no worker, no broker)


def test_a_tracker_that_fails_is_a_warning_and_the_others_still_log(run, monkeypatch, caplog):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    pytest.importorskip("mlflow")
    run_id, run_dir = run
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "nosuchscheme://nowhere")  # MLflow has no store for it
    config = RunConfig(run_id=run_id, report_to=["mlflow", "tensorboard"])
    with caplog.at_level(logging.WARNING, logger="services.trainer.trackers"):
        log_round(run_dir, config.model_dump(mode="json"), metrics_row(3))
    assert f"run {run_id} round 3: not logged to mlflow" in caplog.text
    events = EventAccumulator(str(run_dir / "tensorboard"))
    events.Reload()
    assert [e.step for e in events.Scalars("reward/mean")] == [3]


def wandb_records(path):
    """The records of a W&B transaction log (`run-<id>.wandb`): a 7-byte header, then 32 KiB blocks of chunks
    (crc32, length, type: full/first/middle/last) holding serialized `Record` protos."""
    from wandb.proto import wandb_internal_pb2

    data = path.read_bytes()
    assert data[:4] == b":W&B"
    position, block, pending = 7, 32 * 1024, b""
    while position + 7 <= len(data):
        if block - position % block < 7:  # the block's tail is padding
            position += block - position % block
            continue
        _crc, length, kind = struct.unpack("<IHB", data[position : position + 7])
        if kind == 0:
            break
        pending += data[position + 7 : position + 7 + length]
        position += 7 + length
        if kind in (1, 4):  # full, last
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pending)
            pending = b""
            yield record


def test_wandb_offline_and_mlflow_hold_the_same_metrics_as_tensorboard(run):
    pytest.importorskip("wandb")
    pytest.importorskip("mlflow")
    from mlflow.tracking import MlflowClient
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    run_id, run_dir = run
    config = RunConfig(run_id=run_id, rounds=2, report_to=["tensorboard", "wandb", "mlflow"])
    for round_index in range(2):  # round 1 resumes what round 0 opened
        log_round(run_dir, config.model_dump(mode="json"), metrics_row(round_index), finished=round_index == 1)
    scalars, _ = split_row(metrics_row(0))
    events = EventAccumulator(str(run_dir / "tensorboard"))
    events.Reload()
    assert set(events.Tags()["scalars"]) == set(scalars)

    # W&B, offline (WANDB_MODE unset): one folder per round under <run>/wandb, all of them the run's id
    history, run_ids = {}, set()
    logs = sorted((run_dir / "wandb").glob("offline-run-*/run-*.wandb"))
    assert len(logs) == 2
    for path in logs:
        for record in wandb_records(path):
            if record.WhichOneof("record_type") == "run":
                run_ids.add(record.run.run_id)
            elif record.WhichOneof("record_type") == "history":
                items = {item.key or "/".join(item.nested_key): json.loads(item.value_json)
                         for item in record.history.item}  # fmt: skip
                history[items["_step"]] = items
    assert run_ids == {run_id} and sorted(history) == [0, 1]
    assert {k for k in history[1] if not k.startswith("_") and isinstance(history[1][k], float | int)} == set(scalars)
    assert history[1]["reward/mean"] == 1.25 and history[1]["retriever_version"] == "bridge-r1"

    # MLflow, the file store in <run>/mlruns: one run, kept in <run>/mlflow.json, a step per round
    ids = json.loads((run_dir / "mlflow.json").read_text())
    [(uri, mlflow_run_id)] = ids.items()
    assert uri == (run_dir / "mlruns").resolve().as_uri()
    client = MlflowClient(tracking_uri=uri)
    mlflow_run = client.get_run(mlflow_run_id)
    assert set(mlflow_run.data.metrics) == set(scalars)
    rewards = client.get_metric_history(mlflow_run_id, "reward/mean")
    assert [(m.step, m.value) for m in rewards] == [(0, 0.25), (1, 1.25)]
    assert mlflow_run.data.tags["retriever_version"] == "bridge-r1" and mlflow_run.data.params["algo.algo"] == "bridge"
    assert mlflow_run.info.run_name == run_id and mlflow_run.info.status == "FINISHED"
