"""The trainer's read-only runs API (services/trainer/runs_api.py): views of the run folders, as JSON."""

from __future__ import annotations

import io
import json
from wsgiref.util import setup_testing_defaults

from services.trainer.runs_api import list_runs, run_detail, runs_app


def write_run(runs_dir, run_id: str, rows: list[dict], status: str = "running") -> None:
    folder = runs_dir / run_id
    folder.mkdir(parents=True)
    config = {"run_id": run_id, "dataset": "hotpotqa", "rounds": 3, "source": "dataset",
              "algo": {"algo": "bridge", "estimator": "two-state"}}  # fmt: skip
    (folder / "state.json").write_text(json.dumps({"config": config, "status": status, "next_round": len(rows)}))
    (folder / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows) + '{"round": 9, "tor')


def call(app, path: str, method: str = "GET") -> tuple[str, dict]:
    environ = {"PATH_INFO": path, "REQUEST_METHOD": method, "wsgi.input": io.BytesIO()}
    setup_testing_defaults(environ)
    status = []
    body = b"".join(app(environ, lambda s, headers: status.append(s)))
    return status[0], json.loads(body)


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


def test_wsgi_routes_and_the_metrics_fallback(tmp_path):
    write_run(tmp_path, "r-2", [{"round": 0, "reward/mean": 1.0}], status="done")

    def metrics(environ, start_response):
        start_response("200 OK", [("Content-Type", "application/json")])
        return [b'{"metrics": true}']

    app = runs_app(tmp_path, metrics)
    status, body = call(app, "/v1/runs")
    assert status == "200 OK" and body["runs"][0]["status"] == "done"
    status, body = call(app, "/v1/runs/r-2")
    assert status == "200 OK" and body["summary"]["run_id"] == "r-2" and len(body["metrics"]) == 1
    assert call(app, "/v1/runs/../state")[0] == "404 Not Found"
    assert call(app, "/v1/runs/missing")[0] == "404 Not Found"
    assert call(app, "/v1/runs", method="POST")[0] == "405 Method Not Allowed"
    assert call(app, "/metrics") == ("200 OK", {"metrics": True})
