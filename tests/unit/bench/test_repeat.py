"""bench/repeat.py: each ratio's median and spread over the repeats, the CPU line, and the JSON a bench writes."""

from __future__ import annotations

import argparse
import json

import pytest

from bench import repeat as rep

AMX_CPUINFO = (
    "processor\t: 0\nmodel name\t: Intel(R) Xeon(R) Platinum 8481C CPU @ 2.70GHz\n"
    "flags\t\t: fpu sse2 avx2 avx512f avx512_bf16 amx_bf16 amx_tile\n"
)
AVX2_CPUINFO = "processor\t: 0\nmodel name\t: AMD EPYC 7B13\nflags\t\t: fpu sse2 avx avx2 fma\n"


def test_median_range_and_iqr_of_an_odd_and_an_even_count():
    odd = rep.summarize([1.2, 0.9, 1.5])
    assert (odd.median, odd.low, odd.high) == (1.2, 0.9, 1.5)
    assert odd.q1 == pytest.approx(1.05) and odd.q3 == pytest.approx(1.35)  # halfway between neighbours
    assert odd.repeats == (1.2, 0.9, 1.5)  # in the order they were measured
    even = rep.summarize([4.0, 1.0, 3.0, 2.0])
    assert even.median == 2.5 and (even.low, even.high) == (1.0, 4.0)
    assert (even.q1, even.q3) == pytest.approx((1.75, 3.25))
    one = rep.summarize([2.0])
    assert one.median == one.low == one.high == one.q1 == one.q3 == 2.0
    with pytest.raises(ValueError):
        rep.summarize([])


def test_runs_are_summarized_per_ratio_in_first_seen_order_even_where_a_repeat_lacks_one():
    runs = [{"b": 2.0, "a": 1.0}, {"b": 4.0, "a": 3.0, "c": 9.0}, {"b": 3.0, "a": 2.0}]
    spreads = rep.summarize_runs(runs)
    assert list(spreads) == ["b", "a", "c"]
    assert spreads["b"].median == 3.0 and spreads["a"].median == 2.0
    assert spreads["c"].repeats == (9.0,)  # only the repeat that measured it


def test_the_cpu_is_named_with_its_bf16_flags(tmp_path):
    amx, avx2 = tmp_path / "amx", tmp_path / "avx2"
    amx.write_text(AMX_CPUINFO)
    avx2.write_text(AVX2_CPUINFO)
    cpu = rep.this_cpu(amx)
    assert cpu.model == "Intel(R) Xeon(R) Platinum 8481C CPU @ 2.70GHz"
    assert cpu.flags == ("amx_bf16", "amx_tile", "avx512_bf16", "avx512f", "avx2") and cpu.native_bf16
    assert cpu.cores >= 1
    assert cpu.describe().endswith("native bf16 (amx_bf16, amx_tile, avx512_bf16, avx512f, avx2)")
    plain = rep.this_cpu(avx2)
    assert not plain.native_bf16
    assert plain.describe() == f"AMD EPYC 7B13, {plain.cores} cores, no native bf16 (avx2)"
    assert rep.cpu_model(tmp_path / "missing")  # never empty: platform's name, or "unknown CPU"


def parser_for(bench: str) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser()
    rep.add_repeat_arguments(parser, bench, cost="One repetition is long.")
    return parser


def test_repeat_defaults_to_three_and_json_to_the_bench_results(capsys):
    args = parser_for("agent").parse_args([])
    assert args.repeat == 3 and args.json == rep.BENCH_RESULTS / "agent.json"
    with pytest.raises(SystemExit):
        parser_for("agent").parse_args(["--repeat", "0"])
    assert "at least 1" in capsys.readouterr().err
    parser_for("agent").print_help()
    assert "One repetition is long." in capsys.readouterr().out


def test_repeat_calls_the_measurement_once_per_repeat_with_its_index(capsys):
    calls = []

    def measure(index: int) -> dict[str, float]:
        calls.append(index)
        return {"qps/ours_over_baseline": 2.0 + index}

    runs = rep.repeat(measure, 3)
    assert calls == [0, 1, 2]
    assert runs == [{"qps/ours_over_baseline": v} for v in (2.0, 3.0, 4.0)]
    assert "=== repeat 3/3" in capsys.readouterr().out
    rep.repeat(measure, 1)
    assert "repeat" not in capsys.readouterr().out  # one run prints as the bench always did


def test_finish_prints_median_and_spread_and_writes_the_json(tmp_path, capsys):
    args = argparse.Namespace(json=tmp_path / "sub" / "retriever.json")
    runs = [{"qps/ours_over_baseline@batch1": v, "per_q_s": 2 * v, "cpu@1_ms": 3 * v, "idle_share": v / 10}
            for v in (2.1, 1.9, 2.4)]  # fmt: skip
    data = rep.finish("retriever", args, runs, started=0.0, context={"queries": 512}, argv=["--repeat", "3"])
    out = capsys.readouterr().out
    assert "median and spread over 3 repeats; CPU: " in out
    assert "median 2.10x  min-max 1.90-2.40x" in out and "(2.10 1.90 2.40)" in out
    assert "median 4.20 s" in out  # a key ending in _s is seconds, not a ratio
    assert "median 6.30 ms" in out and "median 0.21  min-max 0.19-0.24  " in out  # milliseconds; a share
    written = json.loads(args.json.read_text())
    assert written == data
    assert written["bench"] == "retriever" and written["repeat"] == 3
    assert written["command"] == "python -m bench.retriever --repeat 3"
    assert written["runs"] == runs and written["context"] == {"queries": 512}
    spread = written["ratios"]["qps/ours_over_baseline@batch1"]
    assert (spread["median"], spread["low"], spread["high"]) == (2.1, 1.9, 2.4)
    assert spread["repeats"] == [2.1, 1.9, 2.4]
    assert written["cpu"]["describe"] == rep.this_cpu().describe() and written["wall_s"] > 0


def test_median_rows_keep_one_row_per_key_with_the_median_value():
    rows = [{"engine": "edge", "n": 10, "p50_ms": v, "repeat": i} for i, v in enumerate((3.0, 1.0, 2.0))]
    rows.append({"engine": "exact", "n": 10, "p50_ms": 5.0, "repeat": 0})
    medians = rep.median_rows(rows, ("engine", "n"), ("p50_ms",))
    assert [(r["engine"], r["p50_ms"]) for r in medians] == [("edge", 2.0), ("exact", 5.0)]
