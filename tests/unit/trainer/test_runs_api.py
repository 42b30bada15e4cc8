"""The trainer's read-only runs API (services/trainer/runs_api.py): views of the run folders, as JSON."""

from __future__ import annotations

import json

from fastapi.testclient import TestClient
from prometheus_client import CollectorRegistry, Counter

from services.trainer.runs_api import build_app, list_runs, run_detail


def write_run(runs_dir, run_id: str, rows: list[dict], status: str = "running") -> None:
    folder = runs_dir / run_id
    folder.mkdir(parents=True)
    config = {"run_id": run_id, "dataset": "hotpotqa", "rounds": 3, "source": "dataset",
              "algo": {"algo": "bridge", "estimator": "two-state"}}  # fmt: skip
    (folder / "state.json").write_text(json.dumps({"config": config, "status": status, "next_round": len(rows)}))
    (folder / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows) + '{"round": 9, "tor')


def test_runs_and_their_rounds_as_json(tmp_path):
    rows = [{"round": 0, "reward/mean": 0.5, "loss/policy": float("nan")}, {"round": 1, "reward/mean": 0.75}]
    write_run(tmp_path, "r-1", rows)
    (tmp_path / "half-written").mkdir()  # no state.json yet: not listed
    [summary] = list_runs(tmp_path).runs
    assert (summary.run_id, summary.algo, summary.estimator, summary.rounds_done) == ("r-1", "bridge", "two-state", 2)
    assert summary.latest == {"round": 1, "reward/mean": 0.75}  # the torn last line is skipped
    detail = run_detail(tmp_path, "r-1")
    assert [r["round"] for r in detail.metrics] == [0, 1] and detail.metrics[0]["loss/policy"] is None  # NaN: null
    assert detail.config["algo"]["estimator"] == "two-state"
    assert run_detail(tmp_path, "nope") is None


def test_routes_errors_in_the_envelope_and_the_metrics(tmp_path):
    write_run(tmp_path, "r-2", [{"round": 0, "reward/mean": 1.0}], status="done")
    registry = CollectorRegistry()
    Counter("bridge_test_scrapes", "a metric of the registry", registry=registry).inc()
    client = TestClient(build_app(tmp_path, registry))
    response = client.get("/v1/runs")
    assert response.status_code == 200 and response.json()["runs"][0]["status"] == "done"
    body = client.get("/v1/runs/r-2").json()
    assert body["summary"]["run_id"] == "r-2" and len(body["metrics"]) == 1
    assert client.head("/v1/runs/r-2").status_code == 200
    outside = client.get("/v1/runs/../state")  # no route: 404, in the envelope too
    assert outside.status_code == 404 and outside.json()["error"]["code"] == "404"
    for path in ("/v1/runs/.hidden", "/v1/runs/missing", "/v1/runs/" + "x" * 65):
        response = client.get(path)
        assert response.status_code == 404, path
        assert response.json()["error"]["type"] == "not_found" and "no run at" in response.json()["detail"]
    refused = client.post("/v1/runs")
    assert refused.status_code == 405 and refused.json()["error"]["code"] == "405"  # read-only
    metrics = client.get("/metrics")
    assert metrics.status_code == 200 and metrics.headers["content-type"].startswith("text/plain")
    assert "bridge_test_scrapes_total 1.0" in metrics.text
