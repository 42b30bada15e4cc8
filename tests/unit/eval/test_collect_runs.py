"""experiments.collect_runs on synthetic run folders: found at any depth, paired by seed against search-r1,
tested across seeds, tabled and plotted."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from experiments.collect_runs import RunManifest, collect, find_runs, load_run


def _run(root: Path, arm: str, seed: int, em: list[float], rewards: list[float], status: str = "done") -> Path:
    folder = root / f"{arm}-s{seed}"
    (folder / "eval" / "final").mkdir(parents=True)
    manifest = RunManifest(arm=arm, seed=seed, run_id=f"cmp-{arm}-s{seed}", command="python -m ...",
                           status=status, wall_s=3600.0, eval_dirs={"final": "eval/final"})  # fmt: skip
    (folder / "run.json").write_text(manifest.model_dump_json())
    (folder / "metrics.jsonl").write_text("".join(json.dumps({"round": i, "reward/mean": r}) + "\n"
                                                  for i, r in enumerate(rewards)))  # fmt: skip
    rows = [{"dataset": "hotpotqa", "id": f"q{i}", "em_greedy": e, "f1_greedy": e, "em_sampled": round(e),
             "f1_sampled": e, "samples": 8, "logprob": -2.0 + e} for i, e in enumerate(em)]  # fmt: skip
    (folder / "eval" / "final" / "questions.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return folder


def test_collect_pairs_seeds_and_tests_across_them(tmp_path):
    a, b = tmp_path / "session-a", tmp_path / "deep" / "session-b"  # runs from two sessions
    for seed in range(4):
        _run(a, "search-r1", seed, [0.0, 0.5, 0.25, 0.25], [0.1, 0.2, 0.3])
        # bridge beats search-r1 by 0.25, 0.25, 0.5, 0.25 per question mean at seeds 0..3
        lift = [0.25, 0.25, 0.5, 0.25][seed]
        _run(b, "bridge", seed, [lift, 0.5 + lift, 0.25 + lift, 0.25 + lift], [0.2, 0.3, 0.4])
    _run(b, "alt-rp", 0, [0.0, 0.5, 0.25, 0.25], [0.1, 0.1, 0.1])  # one seed only: no t-test
    assert len(find_runs([tmp_path])) == 9
    assert load_run(a / "search-r1-s0").rewards == [0.1, 0.2, 0.3]

    analysis = collect([a, b], tmp_path / "out")
    primary = analysis["comparisons"]["bridge"]["em_greedy"]
    assert primary["seeds"] == [0, 1, 2, 3]
    assert [primary["per_seed"][s]["diff"] for s in range(4)] == pytest.approx([0.25, 0.25, 0.5, 0.25])
    t = primary["t"]  # mean 0.3125, sd 0.125, se 0.0625, t = 5 with 3 df
    assert (t["mean"], t["sd"], t["t"], t["df"]) == (pytest.approx(0.3125), pytest.approx(0.125), pytest.approx(5.0), 3)
    assert t["p"] == pytest.approx(0.01539, abs=1e-4)
    assert (primary["sign"]["better"], primary["sign"]["p"]) == (4, pytest.approx(0.125))
    assert primary["per_seed"][0]["low"] == pytest.approx(0.25)  # every question's difference is 0.25 at seed 0
    alt = analysis["comparisons"]["alt-rp"]["em_greedy"]
    assert "t" not in alt and alt["sign"]["ties"] == 1
    assert all("q_bh" in analysis["comparisons"]["bridge"][m] for m in ("em_sampled", "f1_greedy", "logprob"))

    text = (tmp_path / "out" / "results.md").read_text()
    assert "| bridge | **em_greedy** | 4 |" in text and "| alt-rp | 0 | done | 3 |" in text
    for image in ("reward_per_round.png", "eval_per_seed.png", "primary_test.png"):
        assert (tmp_path / "out" / image).stat().st_size > 0


def test_a_seed_run_twice_keeps_the_finished_one(tmp_path):
    _run(tmp_path / "x", "search-r1", 0, [1.0], [0.5], status="done")
    _run(tmp_path / "y", "search-r1", 0, [0.0], [0.5], status="training")
    from experiments.collect_runs import by_arm

    runs = by_arm([load_run(f) for f in find_runs([tmp_path])])
    assert runs["search-r1"][0].questions["em_greedy"] == {"hotpotqa/q0": 1.0}
