"""bench.agent reads vLLM's own counters around a row: summed over labels, differenced, per second and per request."""

from __future__ import annotations

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
"""


def test_counters_sum_over_labels_and_skip_what_is_not_asked():
    got = agent.parse_engine_counters(METRICS)
    assert got["prompt_tokens"] == 1200.0 and got["generation_tokens"] == 480.0
    assert got["requests"] == 10.0 and got["prefill_s"] == 2.5
    assert got["cached_prompt_tokens"] == 0.0 and got["decode_s"] == 0.0  # absent: 0, not an error


def test_engine_during_reports_what_the_row_added(monkeypatch):
    snapshots = iter([
        {"prompt_tokens": 100, "cached_prompt_tokens": 0, "generation_tokens": 50, "requests": 1, "queue_s": 0,
         "prefill_s": 0.1, "decode_s": 1},
        {"prompt_tokens": 1100, "cached_prompt_tokens": 400, "generation_tokens": 350, "requests": 5, "queue_s": 2,
         "prefill_s": 1.3, "decode_s": 9},
    ])  # fmt: skip
    monkeypatch.setattr(agent, "engine_counters", lambda url: next(snapshots))
    clock = iter([10.0, 12.0])
    monkeypatch.setattr(agent.time, "perf_counter", lambda: next(clock))
    result, e = agent.engine_during("url", lambda: "ran")
    assert result == "ran"
    assert e["computed_tok_s"] == pytest.approx((1000 - 400 + 300) / 2)  # cached prompt tokens cost nothing
    assert e["cached_share"] == pytest.approx(0.4) and e["gen_tok_s"] == pytest.approx(150)
    assert e["prefill_s"] == pytest.approx(0.3) and e["queue_s"] == pytest.approx(0.5) and e["decode_s"] == 2
