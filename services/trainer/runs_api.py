"""The trainer's read-only runs API, served beside /metrics by every worker (services/trainer/metrics.py).

Runs live in the trainer's runs folder (`state.json` + `metrics.jsonl` per run), which only the trainer reads and
writes; the services never see it. So the JSON views of runs are served by the trainer too, from the same
process and port as its Prometheus metrics, rather than by a service that would have to share the folder.
A plain WSGI app: no framework beyond what prometheus_client already runs.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable, Iterable
from pathlib import Path

from services.common.schemas.runs import RunDetail, RunList, RunSummary

_RUN = re.compile(r"^/v1/runs/([A-Za-z0-9][A-Za-z0-9_-]{0,63})$")


def _finite(row: dict) -> dict:
    """JSON has no NaN: a non-finite number becomes null."""
    return {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in row.items()}


def _summary(state: dict, latest: dict | None) -> RunSummary:
    config = state["config"]
    return RunSummary(
        run_id=config["run_id"],
        algo=config["algo"]["algo"],
        estimator=config["algo"].get("estimator"),
        dataset=config.get("dataset"),
        source=config.get("source"),
        status=state.get("status", "running"),
        rounds=config["rounds"],
        rounds_done=state.get("next_round", 0),
        retriever_version=state.get("retriever_version"),
        policy_version=state.get("policy_version"),
        error=state.get("error"),
        latest=latest,
    )


def _rows(path: Path) -> list[dict]:
    """metrics.jsonl, one row per round (a few hundred lines at most); a line being written is skipped."""
    rows = []
    for line in path.read_text().splitlines() if path.exists() else []:
        try:
            rows.append(_finite(json.loads(line)))
        except ValueError:
            continue
    return rows


def list_runs(runs_dir: Path) -> RunList:
    runs = []
    for state_path in sorted(runs_dir.glob("*/state.json"), key=lambda p: p.stat().st_mtime, reverse=True):
        try:
            state = json.loads(state_path.read_text())
            rows = _rows(state_path.with_name("metrics.jsonl"))
            runs.append(_summary(state, rows[-1] if rows else None))
        except (OSError, ValueError, KeyError):
            continue  # being written right now: it shows on the next call
    return RunList(runs=runs)


def run_detail(runs_dir: Path, run_id: str) -> RunDetail | None:
    folder = runs_dir / run_id
    try:
        state = json.loads((folder / "state.json").read_text())
    except (OSError, ValueError):
        return None
    rows = _rows(folder / "metrics.jsonl")
    return RunDetail(summary=_summary(state, rows[-1] if rows else None), config=state["config"], metrics=rows)


def runs_app(runs_dir: Path, fallback: Callable) -> Callable:
    """WSGI: `GET /v1/runs`, `GET /v1/runs/{run_id}` as JSON; anything else goes to `fallback` (/metrics)."""

    def respond(start_response, status: str, body: str) -> Iterable[bytes]:
        data = body.encode()
        start_response(status, [("Content-Type", "application/json"), ("Content-Length", str(len(data)))])
        return [data]

    def app(environ, start_response):
        path = environ.get("PATH_INFO", "")
        if not path.startswith("/v1/runs"):
            return fallback(environ, start_response)
        if environ.get("REQUEST_METHOD") not in ("GET", "HEAD"):
            return respond(start_response, "405 Method Not Allowed", json.dumps({"detail": "read-only: GET"}))
        if path.rstrip("/") == "/v1/runs":
            return respond(start_response, "200 OK", list_runs(runs_dir).model_dump_json())
        match = _RUN.match(path)
        detail = run_detail(runs_dir, match.group(1)) if match else None
        if detail is None:
            return respond(start_response, "404 Not Found", json.dumps({"detail": f"no run at {path}"}))
        return respond(start_response, "200 OK", detail.model_dump_json())

    return app
