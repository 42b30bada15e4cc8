"""Worker metrics: the collector reads the runs folder at scrape time, served over real HTTP."""

from __future__ import annotations

import json
import logging
import math
import socket

import httpx
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from services.trainer import metrics
from services.trainer.metrics import RunMetricsCollector, last_line, serve_metrics
from tests.conftest import free_port


def write_run(runs_dir, run_id: str, algo: str, rows: list[dict], status: str = "running") -> None:
    folder = runs_dir / run_id
    folder.mkdir(parents=True)
    state = {"config": {"run_id": run_id, "algo": {"algo": algo}}, "next_round": len(rows), "status": status}
    (folder / "state.json").write_text(json.dumps(state))
    if rows:
        (folder / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))


def row(round_index: int, reward: float) -> dict:
    return {
        "round": round_index, "reward/mean": reward, "em/mean": 0.5, "f1/mean": 0.75, "recall/support": float("nan"),
        "kl/mean": 0.01, "lambda": 1.0 + 0.5 * round_index, "time/train_s": 12.0, "memory/peak_mb": 100.0,
        "loss/policy": -0.2, "loss/retriever": 1.5, "retriever_version": f"a-r{round_index}-retriever",
        "policy_version": f"a-r{round_index}-policy", "activated_at": {"retriever": 1.0},
    }  # fmt: skip


def samples(registry: CollectorRegistry) -> dict[tuple, float]:
    out = {}
    for family in text_string_to_metric_families(generate_latest(registry).decode()):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def test_collector_reports_each_runs_latest_round(tmp_path):
    write_run(tmp_path, "a", "bridge", [row(0, 0.25), row(1, 0.75)])
    write_run(tmp_path, "b", "search-r1", [], status="failed")  # started, nothing published
    (tmp_path / "not-a-run").mkdir()
    registry = CollectorRegistry(auto_describe=False)
    registry.register(RunMetricsCollector(tmp_path))
    got = samples(registry)
    a = (("algo", "bridge"), ("run_id", "a"))
    assert got[("bridge_trainer_reward_mean", a)] == 0.75  # the last row, not the first
    assert got[("bridge_trainer_round", a)] == 1
    assert got[("bridge_trainer_lambda", a)] == 1.5
    assert got[("bridge_trainer_peak_memory_bytes", a)] == 100 * 2**20
    assert math.isnan(got[("bridge_trainer_recall_support", a)])
    assert got[("bridge_trainer_loss", (*a[:1], ("run_id", "a"), ("term", "retriever")))] == 1.5
    assert got[("bridge_trainer_rounds_published_total", a)] == 2
    info = (("algo", "bridge"), ("policy_version", "a-r1-policy"), ("retriever_version", "a-r1-retriever"),
            ("run_id", "a"))  # fmt: skip
    assert got[("bridge_trainer_versions_info", info)] == 1
    b = (("algo", "search-r1"), ("run_id", "b"))
    assert got[("bridge_trainer_run_status", (*b[:1], ("run_id", "b"), ("status", "failed")))] == 1
    assert got[("bridge_trainer_rounds_published_total", b)] == 0
    assert ("bridge_trainer_reward_mean", b) not in got
    # a new round is seen at the next scrape, with no process in between
    with (tmp_path / "a" / "metrics.jsonl").open("a") as fh:
        fh.write(json.dumps(row(2, 1.0)) + "\n")
    assert samples(registry)[("bridge_trainer_reward_mean", a)] == 1.0


def test_last_line_reads_long_files_from_the_end(tmp_path):
    path = tmp_path / "m.jsonl"
    path.write_text("".join(f'{{"round": {i}, "pad": "{"x" * 1000}"}}\n' for i in range(50)))
    assert json.loads(last_line(path, block=64))["round"] == 49
    path.write_text('{"round": 0}')  # no trailing newline, one line
    assert json.loads(last_line(path))["round"] == 0


def test_served_over_http_and_a_second_worker_takes_the_next_free_port_and_says_so(tmp_path, caplog):
    write_run(tmp_path, "a", "bridge", [row(0, 0.5)])
    port = free_port()
    assert serve_metrics(tmp_path, port) == port
    with caplog.at_level(logging.INFO, logger="services.trainer.metrics"):
        second = serve_metrics(tmp_path, port)  # a second worker on this host, same settings
    assert second is not None and second > port
    assert f"port {port} is taken (another worker on this host?): serving on {second}" in caplog.text
    for served in (port, second):  # both answer, with the same numbers (read from the runs folder)
        body = httpx.get(f"http://127.0.0.1:{served}/metrics", timeout=10).text
        assert 'bridge_trainer_reward_mean{algo="bridge",run_id="a"} 0.5' in body
        assert httpx.get(f"http://127.0.0.1:{served}/v1/runs", timeout=10).status_code == 200  # the runs API too
    assert serve_metrics(tmp_path, 0) is None


def test_no_free_port_is_logged_and_the_worker_carries_on(tmp_path, caplog, monkeypatch):
    monkeypatch.setattr(metrics, "PORTS_TRIED", 1)
    with socket.create_server(("127.0.0.1", 0)) as taken:
        port = taken.getsockname()[1]
        with caplog.at_level(logging.WARNING, logger="services.trainer.metrics"):
            assert serve_metrics(tmp_path, port) is None
    assert f"ports {port}-{port} of 127.0.0.1 are all taken" in caplog.text
