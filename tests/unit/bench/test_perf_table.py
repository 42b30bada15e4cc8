"""tools/perf_table.py: docs/performance.md's headline table from the repeat benches' JSON, never from numbers typed
by hand; a bench without a JSON (or without the ratio) is "not measured by the repeat bench yet"."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench import repeat as rep
from tools import perf_table

CPU = rep.Cpu("AMD EPYC 7B13", 2, ("avx2",))


def write_record(results: Path, bench: str, runs: list[dict[str, float]]) -> None:
    data = rep.record(bench, runs, command=f"python -m bench.{bench} --repeat {len(runs)}", wall_s=12.0, cpu=CPU)
    results.mkdir(parents=True, exist_ok=True)
    (results / f"{bench}.json").write_text(json.dumps(data))


def rows_of(table: str) -> dict[str, str]:
    return {line.split(" | ")[0].lstrip("| "): line for line in table.splitlines()[2:]}


def test_rows_come_from_the_json_and_missing_ones_say_so(tmp_path):
    write_record(tmp_path, "retriever", [{"qps/ours_over_baseline@batch1": v} for v in (2.3, 1.9, 2.1)])
    write_record(tmp_path, "agent", [{"qps/service@32_over_baseline": 7.5}])  # a run without the other ratios
    rows = rows_of(perf_table.table(tmp_path))
    assert len(rows) == len(perf_table.HEADLINES)

    retriever = rows["retriever >= 2.0x a Search-R1-style server's queries/s at batch 1"]
    assert "| 2.10x (1.90–2.30x), met | 3 | AMD EPYC 7B13, 2 cores, no native bf16 (avx2) |" in retriever
    assert "`python -m bench.retriever --repeat 3` |" in retriever
    agent = rows["agent >= 8x the one-by-one loop's questions/s at concurrency 32"]
    assert "7.50x (7.50–7.50x), not met | 1 |" in agent
    trained = rows["trained policy tok/s >= 0.9x base (merged, identical work, 32 streams)"]
    assert f"| {perf_table.NOT_MEASURED} |" in trained  # the agent file lacks this ratio
    for headline in perf_table.HEADLINES:
        if headline.bench not in ("retriever", "agent"):  # no file: no number
            row = rows[headline.target]
            assert f"| {perf_table.NOT_MEASURED} |" in row and f"`python -m bench.{headline.bench}`" in row


def test_a_figure_without_a_target_has_no_verdict_and_seconds_print_as_seconds():
    no_goal = perf_table.Headline("informational", "scale", "p50_ms/exact_over_edge@1000000")
    spread = {"median": 14.61, "low": 14.0, "high": 15.2}
    assert perf_table.figure(no_goal, spread) == "14.61x (14.00–15.20x)"
    seconds = perf_table.Headline("per Q sample", "round_scaling", "bridge_per_extra_q_sample@16x4_s", ("<=", 3.0))
    assert perf_table.figure(seconds, {"median": 2.09, "low": 1.5, "high": 2.5}) == "2.09 s (1.50–2.50 s), met"
    strict = perf_table.Headline("below", "train_round", "peak_mb/bridge_over_second-order", ("<", 1.0))
    assert perf_table.figure(strict, {"median": 1.0, "low": 1.0, "high": 1.0}).endswith("not met")


def test_render_replaces_only_the_text_between_the_markers(tmp_path):
    write_record(tmp_path, "scale", [{"p50_ms/exact_over_edge@1000000": 14.6}])
    page = f"# Performance\n\nintro\n\n{perf_table.BEGIN}\nold table\n{perf_table.END}\n\n## hand-written section\n"
    rendered = perf_table.render(page, tmp_path)
    assert rendered.startswith("# Performance\n\nintro\n\n" + perf_table.BEGIN + "\n\n| target |")
    assert rendered.endswith(perf_table.END + "\n\n## hand-written section\n")
    assert "old table" not in rendered and "14.60x (14.60–14.60x) | 1 |" in rendered
    assert perf_table.render(rendered, tmp_path) == rendered  # stable: --check passes right after --write
    with pytest.raises(SystemExit, match="markers not found"):
        perf_table.render("# no markers\n", tmp_path)


def test_every_headline_names_a_bench_that_writes_its_json():
    for headline in perf_table.HEADLINES:
        source = (perf_table.REPO / "bench" / f"{headline.bench}.py").read_text()
        assert f'add_repeat_arguments(parser, "{headline.bench}"' in source


def test_the_performance_page_is_up_to_date():
    page = perf_table.PAGE.read_text()
    assert perf_table.render(page) == page, "docs/performance.md is stale: python -m tools.perf_table --write"
    assert "## bench/retriever.py after padding-aware batching" in page  # the hand-written sections stay
