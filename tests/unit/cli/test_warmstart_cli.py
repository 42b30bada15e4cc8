"""`bridge-rl warmstart` and `bridge-rl prepare --adapter`: a run that exists is never overwritten without
--resume, and an adapter name that does not exist is a one-line error. Nothing trains here."""

from __future__ import annotations

from typer.testing import CliRunner

from services.cli.main import app


def test_an_existing_run_is_resumed_or_refused_never_restarted(tmp_path, monkeypatch):
    monkeypatch.setenv("BRIDGE_DATA_DIR", str(tmp_path / "data"))
    state = tmp_path / "state"
    (state / "checkpoint").mkdir(parents=True)
    (state / "checkpoint" / "state.json").write_text("{}")
    result = CliRunner().invoke(app, ["warmstart", "--qa-dir", str(tmp_path), "--state-dir", str(state)])
    assert result.exit_code == 2, result.output
    assert "holds a run: pass --resume" in result.output and "Traceback" not in result.output


def test_warmstart_help_names_resume_and_the_recipe():
    result = CliRunner().invoke(app, ["warmstart", "--help"], env={"COLUMNS": "200"})
    assert result.exit_code == 0
    for option in ("--resume", "--recipe", "--template-weight", "--gold-missing", "--bridge", "--hold-out",
                   "--state-dir", "--continue-from", "--init-from"):  # fmt: skip
        assert option in result.output


def test_prepare_refuses_an_unknown_adapter(tmp_path, monkeypatch):
    monkeypatch.setenv("BRIDGE_DATA_DIR", str(tmp_path))
    result = CliRunner().invoke(app, ["prepare", "--adapter", "nope"])
    assert result.exit_code == 2 and "shipped adapters are reading, protocol" in result.output


def test_continue_from_and_init_from_are_one_or_the_other(tmp_path, monkeypatch):
    monkeypatch.setenv("BRIDGE_DATA_DIR", str(tmp_path / "data"))
    adapter = str(tmp_path / "adapter")
    result = CliRunner().invoke(app, ["warmstart", "--qa-dir", str(tmp_path), "--state-dir", str(tmp_path / "s"),
                                      "--continue-from", adapter, "--init-from", adapter])  # fmt: skip
    assert result.exit_code == 2 and "--init-from" in result.output and "Traceback" not in result.output


def test_rank_and_lora_targets_reach_the_config(tmp_path, monkeypatch):
    """`--rank` and `--lora-targets` choose the LoRA the run trains (alpha twice the rank); an unknown target set is a
    usage error."""
    import services.trainer.warmstart.run as warmstart
    from services.trainer.warmstart.config import LORA_TARGETS

    monkeypatch.setenv("BRIDGE_DATA_DIR", str(tmp_path / "data"))
    seen = {}

    def fake_run(config, **kwargs):
        seen["config"] = config
        raise ValueError("stopped before training")

    monkeypatch.setattr(warmstart, "run_warmstart", fake_run)
    args = ["warmstart", "--qa-dir", str(tmp_path), "--state-dir", str(tmp_path / "s")]
    result = CliRunner().invoke(app, [*args, "--rank", "8", "--lora-targets", "attention"])
    assert result.exit_code == 2 and "stopped before training" in result.output
    config = seen["config"]
    assert (config.lora_rank, config.lora_alpha) == (8, 16)
    assert config.target_modules == ["q_proj", "k_proj", "v_proj", "o_proj"]
    assert CliRunner().invoke(app, args).exit_code == 2 and seen["config"].target_modules == list(
        LORA_TARGETS["all-linear"]
    )
    assert CliRunner().invoke(app, [*args, "--lora-targets", "everything"]).exit_code == 2
