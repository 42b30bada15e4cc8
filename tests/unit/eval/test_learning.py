"""The learning runs' per-question comparison: means before/after per dataset, group and overall, paired by
(dataset, id), with the sign test (the training itself is the trainer's integration test)."""

from __future__ import annotations

import pytest

from experiments.learning import compare
from services.eval.scoring import ItemResult


def _result(dataset: str, qid: str, em: float, recall: float | None = 0.5) -> ItemResult:
    return ItemResult(dataset=dataset, mode="agent", id=qid, question="?", golden_answers=["a"], answer="a",
                      em=em, f1=em, recall=recall, retrieved_ids=[], searches=1, latency_s=0.1)  # fmt: skip


def test_compare_pairs_questions_and_tests_signs():
    before = [_result("nq", f"q{i}", 0.0) for i in range(6)] + [_result("hotpotqa", "h0", 1.0, None)]
    after = [_result("nq", f"q{i}", 1.0) for i in range(6)][::-1] + [_result("hotpotqa", "h0", 0.0, None)]
    out = compare(before, after, ["nq", "hotpotqa"])
    assert set(out) == {"nq", "hotpotqa", "group:general", "group:multi-hop", "all"}
    nq = out["nq"]["em"]
    assert (nq["before"], nq["after"]) == (0.0, 1.0)  # paired by id, whatever the order
    assert (nq["sign"]["better"], nq["sign"]["worse"]) == (6, 0) and nq["sign"]["p"] == pytest.approx(2 / 64)
    assert out["all"]["n"] == 7 and out["all"]["em"]["sign"]["worse"] == 1
    assert "recall" not in out["hotpotqa"]  # no supporting passages known: no recall to compare


def test_reward_signal_counts_only_groups_whose_rewards_differ():
    from experiments.reward_signal import group_signal

    signal = group_signal({"q1": [0.0, 0.0, 0.0, 0.0], "q2": [1.0, 0.0, 0.0, 0.0], "q3": [0.2, 0.2, 0.2, 0.2]})
    assert signal["groups"] == 3 and signal["informative_groups"] == 1
    assert abs(signal["mean_reward"] - (1.0 + 0.8) / 12) < 1e-9


def test_update_size_flags_reach_every_algorithms_run_config():
    from experiments.learning import build_parser, run_config

    args = build_parser().parse_args(["--data-dir", "d", "--qa-dir", "q", "--policy-steps", "3", "--policy-lr",
                                      "5e-4", "--rounds", "7", "--reward", "em-format"])  # fmt: skip
    for algo in ("search-r1", "bridge"):
        config = run_config(args, algo)
        assert (config.algo.algo, config.algo.policy_steps, config.algo.policy_lr) == (algo, 3, 5e-4)
        assert (config.rounds, config.reward, config.dataset) == (7, "em-format", "nq")
    defaults = run_config(build_parser().parse_args(["--data-dir", "d", "--qa-dir", "q"]), "bridge")
    assert (defaults.algo.policy_steps, defaults.algo.policy_lr) == (1, 1e-4)  # the paper's single step
    assert defaults.algo.gamma == 0.02 and defaults.algo.next_lambda(0.02) == 0.02  # the paper's fixed gamma
    held = run_config(build_parser().parse_args(["--data-dir", "d", "--qa-dir", "q", "--gamma", "1"]), "bridge")
    assert held.algo.initial_lambda == held.algo.next_lambda(1.0) == 1.0  # alt-rp's update, as bridge
