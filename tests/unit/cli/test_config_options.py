"""The train command's choices and bounds come from the config models: a value the model adds is a choice of the
flag, and a bound the model sets is the flag's."""

from __future__ import annotations

from typing import get_args

from typer.testing import CliRunner

from services.cli.commands_train import AlgoName, RewardName, SourceName
from services.cli.config_options import choices, option
from services.cli.main import app
from services.trainer.algo.config import Algo, AlgoConfig
from services.trainer.run_state import RunConfig


def test_choices_are_the_models_literals():
    assert [a.value for a in AlgoName] == list(get_args(Algo))
    assert {r.value for r in RewardName} == {"em", "f1", "em-format"}
    assert {s.value for s in SourceName} == {"dataset", "live"}
    assert choices(AlgoConfig, "estimator", "E").two_state.value == "two-state"


def test_an_option_takes_the_fields_meaning_and_bounds():
    info = option(RunConfig, "questions_per_round")
    assert (info.min, info.max) == (1, 64) and info.help == RunConfig.model_fields["questions_per_round"].description


def test_a_flag_outside_the_models_bound_is_a_usage_error():
    result = CliRunner().invoke(app, ["train", "--group-size", "1", "--print-config"])
    assert result.exit_code == 2 and "group-size" in result.output
    result = CliRunner().invoke(app, ["train", "--algo", "bridge", "--rounds", "3", "--print-config"])
    assert result.exit_code == 0 and 'algo = "bridge"' in result.output and "rounds = 3" in result.output
