"""The repeat wiring of the benches that start models or services: each repetition's ratios come from that
repetition's rows, --repeat runs the measurement that many times, and every ratio docs/performance.md's headline
table reads is one the bench reports. Fakes stand in for the rounds, servers and engines (no model is loaded)."""

from __future__ import annotations

import argparse
import itertools
import json
from types import SimpleNamespace

import pytest

from bench import agent, retriever, round_scaling, train_round
from tools.perf_table import HEADLINES


def headline_keys(bench: str) -> set[str]:
    return {h.key for h in HEADLINES if h.bench == bench}


def test_train_round_repeats_its_rows_and_reports_their_ratios(tmp_path, monkeypatch):
    peak = {"search-r1": 1000.0, "bridge": 1050.0, "two-state": 2000.0, "second-order": 3000.0,
            "bridge/retriever": 700.0, "two-state/retriever": 900.0}  # fmt: skip
    calls = itertools.count()

    def fake_module(module: str, *args: str) -> str:
        assert module == "bench.train_round" and args[0] == "--one"
        row, repeat = args[1], next(calls) // len(peak)
        seconds = {"bridge": 12.0 + repeat}.get(row, 10.0)
        result = {"row": row, "seconds": seconds, "peak_mb": peak[row], "loaded_mb": 500.0, "q_samples": 4,
                  "device": "cpu, fp32"}  # fmt: skip
        return "a log line\n" + json.dumps(result) + "\n"

    monkeypatch.setattr(train_round, "run_module", fake_module)
    monkeypatch.setattr(train_round, "prepare_models", lambda work: None)
    batch, record = tmp_path / "batch.json", tmp_path / "train_round.json"
    batch.write_text("{}")  # there already: no rollouts are built
    train_round.main(["--work", str(tmp_path), "--batch", str(batch), "--repeat", "3", "--json", str(record)])

    data = json.loads(record.read_text())
    assert next(calls) == 3 * len(peak)  # every row, three times
    ratios = data["ratios"]
    assert ratios["seconds/bridge_over_search-r1"]["repeats"] == [1.2, 1.3, 1.4]
    assert ratios["peak_mb/bridge_over_search-r1"]["median"] == pytest.approx(1.05)
    assert ratios["over_load_mb/two-state_over_bridge@retriever_update"]["median"] == pytest.approx(2.0)
    assert data["context"] == {"retriever_params": "full", "device": "cpu, fp32"}
    assert headline_keys("train_round") <= set(ratios)


def test_round_scaling_repeats_every_round_and_reports_per_shape_ratios(tmp_path, monkeypatch):
    calls = itertools.count()

    def fake_round(row: str, batch, work, q_steps: int | None = None) -> dict:
        repeat = next(calls) // 5  # 2 shapes x 2 rows + one Q-subsample round (q 8 is the 8x4 bridge row)
        seconds = {"search-r1": 10.0, "bridge": 12.0 + repeat}[row] + (q_steps or 8)
        return {"row": row, "seconds": seconds, "peak_mb": 1000.0, "loaded_mb": 500.0, "q_samples": q_steps or 8}

    monkeypatch.setattr(round_scaling, "round_row", fake_round)
    monkeypatch.setattr(round_scaling, "prepare_models", lambda work: None)
    monkeypatch.setattr(round_scaling, "plot", lambda rows, out: out.write_text(json.dumps(rows)))
    (tmp_path / "round-scaling").mkdir()
    (tmp_path / "round-scaling" / "rollouts-8x4.json").write_text(json.dumps({"records": [], "docs": {}}))
    record, out = tmp_path / "round_scaling.json", tmp_path / "rows.json"
    round_scaling.main(["--work", str(tmp_path), "--shapes", "4x2", "8x4", "--q-steps", "2", "8", "--repeat", "2",
                        "--json", str(record), "--out", str(out)])  # fmt: skip

    data = json.loads(record.read_text())
    assert next(calls) == 10
    ratios = data["ratios"]
    assert ratios["seconds/bridge_over_search-r1@8x4"]["repeats"] == [20 / 18, 21 / 18]
    assert ratios["bridge_per_extra_q_sample@8x4_s"]["repeats"] == [pytest.approx(1.0)] * 2  # (20 - 14) / 6
    assert headline_keys("round_scaling") <= set(ratios)
    assert len(json.loads(out.read_text())["rows"]) == 2 * 6  # 5 rounds and the reused 8x4 row, each repeat
    assert len(json.loads(out.with_suffix(".png").read_text())) == 6  # the plot gets their medians


def test_retriever_repetition_reports_both_batches_and_the_floor(monkeypatch):
    drives = []

    async def fake_drive(url: str, path: str, body_for, batches, concurrency: int, *, client, server_pid) -> dict:
        drives.append((url, client, server_pid))
        return {"qps": 210.0 if url == "ours" else 100.0, "p50_ms": 5.0, "p99_ms": 9.0, "cpu_busy_share": 0.9,
                "server_cpu_ms_per_query": 8.0 if url == "ours" else 12.0, "client_cpu_ms_per_query": 1.5}  # fmt: skip

    monkeypatch.setattr(retriever, "drive", fake_drive)
    # The floor at 8 right before the batch-1 drives, right after them (averaged: 300 q/s, 6 CPU ms), then at 1.
    floors = iter([(8, 400.0, 4.0), (8, 200.0, 8.0), (1, 90.0, 20.0)])

    def fake_floor(encoder, queries, batch_size: int) -> dict:
        expected, qps, cpu = next(floors)
        assert batch_size == expected
        return {"qps": qps, "cpu_ms_per_query": cpu}

    monkeypatch.setattr(retriever, "encoder_floor", fake_floor)
    # our server's micro-batch histogram, (queries, batches) so far: 64 queries in 16 forwards at batch 1, then 128
    # queries (4 x 32) in 2 forwards at batch 32
    reads = iter([(0.0, 0.0), (64.0, 16.0), (64.0, 16.0), (192.0, 18.0)])
    monkeypatch.setattr(retriever, "micro_batches", lambda url: next(reads))
    servers = {"baseline": ("baseline", "/retrieve", None, 11), "ours": ("ours", "/v1/search", None, 22)}
    ratios = retriever.measure_throughput(servers, None, ["a question"] * 64, 8, "raw")
    assert ratios == {
        "qps/ours_over_baseline@batch1": 2.1,
        "qps/ours_over_baseline@batch32": 2.1,
        "qps/ours@batch1_over_encoder_floor@8": 0.7,
        "cpu_per_query/encoder_floor@8_over_ours@batch1": 0.75,  # 6 of the server's 8 CPU ms a query
        "client_cpu_per_query@batch1_ms": 1.5,
        "queries_per_forward/ours@batch1": 4.0,
        "queries_per_forward/ours@batch32": 64.0,
    }
    assert set(drives) == {("baseline", "raw", 11), ("ours", "raw", 22)}  # each server's own process is watched
    assert headline_keys("retriever") <= set(ratios)


def test_agent_repetitions_start_from_the_base_weights(monkeypatch):
    activated = []

    async def fake_service(url: str, questions, concurrency: int, max_turns: int) -> dict:
        trained = bool(activated) and activated[-1] == "trained"
        ids = [f"{'trained' if trained else 'base'}-{i}" for i in range(4)]
        return {"qps": 4.0 * concurrency**0.5, "p50": 1.0, "p99": 2.0, "elapsed": 2.0, "ids": ids}

    def fake_tokens(url: str, trajectory_ids: list[str]) -> int:  # the trained policy says half as much
        return sum(25 if t.startswith("trained") else 50 for t in trajectory_ids)

    async def fake_raw(
        url: str, prompts, concurrency: int, max_tokens: int, fixed_length: bool = False, key: str | None = None
    ) -> float:
        return 190.0 if activated and activated[-1] == "trained" else 200.0

    monkeypatch.setattr(agent, "run_service", fake_service)
    monkeypatch.setattr(agent, "generated_tokens", fake_tokens)
    monkeypatch.setattr(agent, "raw_vllm", fake_raw)
    monkeypatch.setattr(agent, "run_baseline", lambda *a: {"qps": 2.0, "p50": 1.0, "p99": 1.0, "tok_s": 20.0})
    monkeypatch.setattr(agent, "activate", lambda policy, version: activated.append(version))
    reads = []  # vLLM's /metrics: a counter that grows by 100 generated tokens between two reads

    def fake_counters(url: str) -> dict[str, float]:
        reads.append(url)
        return {key: 100.0 * len(reads) if key == "generation_tokens" else 0.0 for key in agent.ENGINE_SAMPLES}

    monkeypatch.setattr(agent, "engine_counters", fake_counters)
    monkeypatch.setattr(agent, "sample_gauges", lambda url, every_s, stop, into: None)  # no gauge: never idle
    setup = agent.Setup("retriever", "vllm", None, ["q"] * 4, ["q"] * 4)
    args = argparse.Namespace(max_turns=1, max_tokens=48)
    service32: list[dict] = []
    policy = SimpleNamespace(url="policy")
    runs = [agent.measure_merged(policy, setup, args, "base", "trained", i, service32) for i in range(2)]

    assert activated == ["trained", "base", "trained"]  # the second repetition re-activates the base first
    assert set(reads) == {"vllm"} and len(reads) == 2 * 2 * 5  # around the 3 agent rows, fixed length, trained
    engine_keys = ["engine_computed_tok_s/service@32_over_fixed_length@32",
                   "engine_busy_computed_tok_s/service@32_over_fixed_length@32"]  # fmt: skip
    for key in engine_keys:  # ratios of two timings: only their presence and sign are fixed
        assert all(run.pop(key) > 0 for run in runs)
    # The fake counters hold no running-request seconds, and no gauge sample ever saw the engine idle.
    assert [run.pop("engine_mean_running/service@32_over_fixed_length@32") for run in runs] == [0.0, 0.0]
    assert [run.pop("engine_idle_share/service@32") for run in runs] == [0.0, 0.0]
    assert (
        runs[0]
        == runs[1]
        == {
            "qps/service@32_over_baseline": pytest.approx(4.0 * 32**0.5 / 2.0),
            "tok_s/service@32_over_raw_vllm@32": 0.5,
            "tok_s/trained_merged_over_base@32_same_work": 0.95,
            "agent_tok_s/trained_merged_over_base@32": 0.5,
        }
    )
    assert len(service32) == 2 and agent.measure_lora(policy, setup, args, service32[0]) == 0.5
    popped = {*engine_keys, "engine_mean_running/service@32_over_fixed_length@32", "engine_idle_share/service@32"}
    assert headline_keys("agent") <= set(runs[0]) | popped


def test_activate_registers_a_checkpoint_folder_but_never_the_base(monkeypatch):
    """The base has no folder: registering "base" is a 404 (the second repetition's first step, once)."""
    from types import SimpleNamespace

    from bench import agent

    posted = []

    def post(url, json=None, headers=None, timeout=None):
        posted.append((url.removeprefix("http://p"), json))
        return SimpleNamespace(raise_for_status=lambda: None)

    monkeypatch.setattr(agent.httpx, "post", post)
    policy = SimpleNamespace(url="http://p", token="t")
    agent.activate(policy, "base")
    assert posted == [("/v1/checkpoints/base/activate", None)]
    posted.clear()
    agent.activate(policy, "trained-1")
    assert posted == [("/v1/checkpoints", {"path": "trained-1"}), ("/v1/checkpoints/trained-1/activate", None)]
