"""A run's state file across versions: a state saved before the bridge estimators required a fixed gamma still
loads (and so can still be marked failed), while a new config asking for that is refused as before."""

from __future__ import annotations

import json
import logging

import pytest
from pydantic import ValidationError

from services.trainer.algo.config import AlgoConfig
from services.trainer.round_files import mark_failed
from services.trainer.run_state import RunConfig, RunState
from services.trainer.settings import TrainerSettings


def write_old_state(settings: TrainerSettings, run_id: str, estimator: str, lam: float = 2.5) -> None:
    """The state file as a version before `gamma` became required wrote it: gamma null, lambda on its schedule."""
    config = RunConfig(run_id=run_id, algo=AlgoConfig(gamma=None, estimator="two-state"))
    data = RunState(config=config, lam=lam, next_round=3).model_dump(mode="json")
    data["config"]["algo"]["estimator"] = estimator  # what `_checks` now refuses
    path = RunState.path(settings.runs_dir, run_id)
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps(data))


@pytest.mark.parametrize("estimator", ["bridge", "drop"])
def test_an_old_state_with_gamma_null_loads_at_the_papers_gamma_and_says_so(tmp_path, caplog, estimator):
    settings = TrainerSettings(data_dir=tmp_path)
    write_old_state(settings, "old", estimator)
    with caplog.at_level(logging.WARNING, logger="services.trainer.run_state"):
        state = RunState.load(settings.runs_dir, "old")
    assert state.config.algo.gamma == 0.02 and state.config.algo.estimator == estimator
    assert state.lam == 0.02 and state.next_round == 3  # lambda = gamma every round, as a new run has it
    assert f"run old: saved with gamma null and estimator {estimator!r}" in caplog.text
    assert "continues at the paper's fixed gamma 0.02 (lambda was 2.5)" in caplog.text


def test_an_old_two_state_run_keeps_its_schedule(tmp_path, caplog):
    settings = TrainerSettings(data_dir=tmp_path)
    write_old_state(settings, "sched", "two-state")
    with caplog.at_level(logging.WARNING, logger="services.trainer.run_state"):
        state = RunState.load(settings.runs_dir, "sched")
    assert state.config.algo.gamma is None and state.lam == 2.5 and not caplog.text


def test_mark_failed_records_the_error_of_an_old_run(tmp_path):
    """Celery's `on_failure` calls mark_failed: on an old state it raised, and the run stayed 'running'."""
    settings = TrainerSettings(data_dir=tmp_path)
    write_old_state(settings, "old", "bridge")
    mark_failed(settings, "old", "train round 3 (round): RuntimeError('boom')")
    state = RunState.load(settings.runs_dir, "old")
    assert (state.status, state.error) == ("failed", "train round 3 (round): RuntimeError('boom')")


def test_a_new_config_with_gamma_null_and_the_bridge_estimator_is_still_refused():
    refused = "estimator 'bridge' is measured only at a fixed gamma"
    with pytest.raises(ValidationError, match=refused):
        AlgoConfig(gamma=None)
    with pytest.raises(ValidationError, match=refused):
        RunConfig.model_validate({"run_id": "new", "algo": {"gamma": None, "estimator": "bridge"}})
    config = RunConfig(run_id="new", algo=AlgoConfig(gamma=None, estimator="two-state"))
    data = RunState(config=config, lam=1.0).model_dump(mode="json")
    data["config"]["algo"]["estimator"] = "bridge"
    with pytest.raises(ValidationError, match=refused):  # only loading a saved state migrates
        RunState.model_validate(data)
