"""bench.agent reads vLLM's own counters around a row: summed over labels, differenced, per second and per request."""

from __future__ import annotations

import threading

import pytest

import bench.agent as agent

METRICS = """# HELP vllm:prompt_tokens_total Number of prefill tokens processed.
# TYPE vllm:prompt_tokens_total counter
vllm:prompt_tokens_total{engine="0",model_name="base"} 1000.0
vllm:prompt_tokens_total{engine="1",model_name="base"} 200.0
# HELP vllm:prompt_tokens_created Number of prefill tokens processed.
# TYPE vllm:prompt_tokens_created gauge
vllm:prompt_tokens_created{engine="0",model_name="base"} 1.7e9
# TYPE vllm:generation_tokens_total counter
vllm:generation_tokens_total{engine="0",model_name="base"} 480.0
# TYPE vllm:request_prefill_time_seconds histogram
vllm:request_prefill_time_seconds_bucket{engine="0",le="+Inf",model_name="base"} 10.0
vllm:request_prefill_time_seconds_count{engine="0",model_name="base"} 10.0
vllm:request_prefill_time_seconds_sum{engine="0",model_name="base"} 2.5
# TYPE vllm:iteration_tokens_total histogram
vllm:iteration_tokens_total_bucket{engine="0",le="+Inf",model_name="base"} 40.0
vllm:iteration_tokens_total_count{engine="0",model_name="base"} 40.0
vllm:iteration_tokens_total_sum{engine="0",model_name="base"} 900.0
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="base"} 3.0
vllm:num_requests_running{engine="1",model_name="base"} 2.0
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="base"} 1.0
# TYPE vllm:num_requests_waiting_by_reason gauge
vllm:num_requests_waiting_by_reason{engine="0",model_name="base",reason="capacity"} 7.0
"""


def test_counters_sum_over_labels_and_skip_what_is_not_asked():
    got = agent.parse_engine_counters(METRICS)
    assert got["prompt_tokens"] == 1200.0 and got["generation_tokens"] == 480.0
    assert got["requests"] == 10.0 and got["prefill_s"] == 2.5
    assert got["cached_prompt_tokens"] == 0.0 and got["decode_s"] == 0.0  # absent: 0, not an error
    assert got["steps"] == 40.0 and got["step_tokens"] == 900.0  # a histogram's count and sum, not its buckets


def test_gauges_sum_over_labels_and_skip_lookalike_names():
    assert agent.parse_engine_gauges(METRICS) == {"running": 5.0, "waiting": 1.0}
    assert agent.parse_engine_gauges("") == {"running": 0.0, "waiting": 0.0}


def test_the_gauge_sampler_reads_until_told_to_stop(monkeypatch):
    stop, samples, reads = threading.Event(), [], []

    def fake_gauges(url: str) -> dict[str, float]:
        reads.append(url)
        if len(reads) == 3:
            stop.set()
        return {"running": float(len(reads)), "waiting": 0.0}

    monkeypatch.setattr(agent, "engine_gauges", fake_gauges)
    agent.sample_gauges("vllm", 0.001, stop, samples)
    assert reads == ["vllm"] * 3 and [g["running"] for g in samples] == [1.0, 2.0, 3.0]


def test_engine_during_reports_what_the_row_added(monkeypatch):
    snapshots = iter([
        {"prompt_tokens": 100, "cached_prompt_tokens": 0, "generation_tokens": 50, "requests": 1, "queue_s": 0,
         "prefill_s": 0.1, "decode_s": 1, "running_s": 1, "steps": 10, "step_tokens": 100},
        {"prompt_tokens": 1100, "cached_prompt_tokens": 400, "generation_tokens": 350, "requests": 5, "queue_s": 2,
         "prefill_s": 1.3, "decode_s": 9, "running_s": 7, "steps": 30, "step_tokens": 700},
    ])  # fmt: skip
    monkeypatch.setattr(agent, "engine_counters", lambda url: next(snapshots))
    gauges = [{"running": 0.0, "waiting": 0.0}, {"running": 4.0, "waiting": 0.0}, {"running": 0.0, "waiting": 2.0},
              {"running": 0.0, "waiting": 0.0}]  # fmt: skip
    monkeypatch.setattr(agent, "sample_gauges", lambda url, every_s, stop, into: into.extend(gauges))
    clock = iter([10.0, 12.0])
    monkeypatch.setattr(agent.time, "perf_counter", lambda: next(clock))
    result, e = agent.engine_during("url", lambda: "ran")
    assert result == "ran"
    assert e["computed_tok_s"] == pytest.approx((1000 - 400 + 300) / 2)  # cached prompt tokens cost nothing
    assert e["cached_share"] == pytest.approx(0.4) and e["gen_tok_s"] == pytest.approx(150)
    assert e["prefill_s"] == pytest.approx(0.3) and e["queue_s"] == pytest.approx(0.5) and e["decode_s"] == 2
    assert e["mean_running"] == pytest.approx(3.0) and e["tokens_per_step"] == pytest.approx(30.0)
    # Two of four samples saw nothing running or waiting: the engine had work for half the row's 2 s.
    assert e["idle_share"] == 0.5 and e["busy_computed_tok_s"] == pytest.approx(900 / 1.0)
    assert e["step_ms"] == pytest.approx(1000 * 1.0 / 20)
