"""experiments.comparison: the config file, each arm's RunConfig, argument parsing and the merged training pool
(the runs themselves need the stack and are not started here)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from experiments.comparison import build_parser, load_config, merged_training_pool, parse_seeds, plan
from services.trainer.config_file import load_run_config

CONFIG = Path(__file__).resolve().parents[3] / "configs" / "comparison.toml"


def test_shipped_config_gives_every_arm_the_recipe():
    config = load_config(CONFIG)
    # docs/preregistration.md: the four open-domain sets with passages and training pools, trained and evaluated
    assert config.comparison.train_datasets == config.comparison.eval_datasets == ["nq", "popqa", "hotpotqa",
                                                                                   "2wikimultihopqa"]  # fmt: skip
    assert (config.comparison.eval_questions, config.comparison.samples) == (100, 8)
    runs = {arm: config.run_config(arm, 2) for arm in config.comparison.arms}
    assert set(runs) == {"search-r1", "bridge", "alt-pr"}
    for arm, run in runs.items():
        assert (run.algo.algo, run.algo.seed, run.run_id, run.dataset) == (arm, 2, f"cmp-{arm}-s2", "comparison")
        assert (run.rounds, run.questions_per_round, run.algo.group_size, run.reward) == (20, 4, 4, "em")
        assert run.algo.policy_lr == 5e-4
    assert runs["bridge"].algo.gamma == 0.02 and runs["alt-pr"].algo.gamma == 1.0
    # the same questions for every arm at a seed: everything the draw depends on is shared
    draws = {(r.dataset, r.algo.seed, r.questions_per_round, r.rounds) for r in runs.values()}
    assert len(draws) == 1


def test_bad_config_fails_at_load(tmp_path):
    bad = tmp_path / "c.toml"
    bad.write_text("[run]\nrounds = 0\n")
    with pytest.raises(ValueError, match="rounds"):
        load_config(bad)
    bad.write_text("[comparison]\nsamples = 8\ntypo = 1\n")
    with pytest.raises(ValueError, match="typo"):
        load_config(bad)
    with pytest.raises(ValueError, match="unknown arm"):
        load_config(CONFIG).run_config("joint-ish", 0)


def test_arguments_and_plan():
    args = build_parser().parse_args(["run", "--arm", "bridge", "--seed", "2", "--config", str(CONFIG),
                                      "--out", "runs/comparison/bridge-s2", "--resume"])  # fmt: skip
    assert (args.command, args.arm, args.seed, args.resume, args.out) == (
        "run",
        "bridge",
        2,
        True,
        Path("runs/comparison/bridge-s2"),
    )
    with pytest.raises(SystemExit):
        build_parser().parse_args(["run", "--arm", "nope", "--seed", "0", "--out", "x"])
    assert parse_seeds("0-3") == [0, 1, 2, 3] and parse_seeds("1,4-5") == [1, 4, 5]
    args = build_parser().parse_args(["plan", "--seeds", "0-1", "--config", str(CONFIG)])
    commands = plan(args, load_config(CONFIG))
    assert len(commands) == 6 and "--arm search-r1 --seed 0" in commands[0] and "--seed 1" in commands[-1]
    assert all(c.endswith("--resume") for c in commands)


def _qa(path: Path, n: int, prefix: str) -> None:
    path.write_text("".join(json.dumps({"id": str(i), "question": f"{prefix}{i}?", "golden_answers": ["a"]}) + "\n"
                            for i in range(n)))  # fmt: skip


def test_merged_pool_skips_evaluation_splits_and_alternates(tmp_path):
    _qa(tmp_path / "a.jsonl", 103, "a")
    _qa(tmp_path / "b.jsonl", 102, "b")
    folder, sha = merged_training_pool(tmp_path, ["a", "b"], tmp_path / "merged")
    rows = [json.loads(line) for line in (folder / "comparison_train.jsonl").read_text().splitlines()]
    assert [r["id"] for r in rows] == ["a/100", "b/100", "a/101", "b/101", "a/102"]
    assert merged_training_pool(tmp_path, ["a", "b"], tmp_path / "merged")[1] == sha  # deterministic
    # the trainer reads it as a training file, from line 0
    from services.data.split import training_rows

    assert len(training_rows(folder, "comparison")) == 5


def test_gpu_config_is_a_valid_run_config():
    config = load_run_config(CONFIG.parent / "gpu-qwen2.5-3b.toml")
    assert config.algo.gamma == 0.02 and config.algo.group_size >= 2


def test_a_run_records_the_commit_of_the_plan_it_runs_under():
    from experiments.comparison import PLAN, git_commit

    plan_commit, head = git_commit(PLAN), git_commit()
    if head is None:
        pytest.skip("not a git checkout")
    assert plan_commit is not None and len(plan_commit) == 40  # the plan is committed: runs can name it
