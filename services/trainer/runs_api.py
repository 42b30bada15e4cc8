"""The trainer's read-only runs API, served beside /metrics by every worker (services/trainer/metrics.py).

Runs live in the trainer's runs folder (`state.json` + `metrics.jsonl` per run), which only the trainer reads and
writes; the services never see it. So the JSON views of runs are served by the trainer too, from the same
process and port as its Prometheus metrics, rather than by a service that would have to share the folder.
A FastAPI app (`build_app`) with the services' error envelope (services/common/errors.py).
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import Annotated

from fastapi import APIRouter, Depends, FastAPI, Request, Response
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from services.common.errors import NotFound, error_body, install_error_handlers
from services.common.schemas.runs import RunDetail, RunList, RunSummary

_RUN_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]{0,63}$")


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


async def _runs_dir(request: Request) -> Path:
    return request.app.state.runs_dir


async def _registry(request: Request) -> CollectorRegistry:
    return request.app.state.registry


RunsDir = Annotated[Path, Depends(_runs_dir)]
Registry = Annotated[CollectorRegistry, Depends(_registry)]
_NOT_FOUND = {404: {"description": "No such run", "content": {"application/json": {"example": error_body(
    404, "not_found", "no run at /v1/runs/nope")}}}}  # fmt: skip
router = APIRouter()


@router.api_route("/v1/runs", methods=["GET", "HEAD"])
def runs(runs_dir: RunsDir) -> RunList:
    """Every run in the runs folder, most recently changed first, with its latest round's metrics."""
    return list_runs(runs_dir)


@router.api_route("/v1/runs/{run_id}", methods=["GET", "HEAD"], responses=_NOT_FOUND)
def run(run_id: str, runs_dir: RunsDir) -> RunDetail:
    """One run: its summary, config and every round's metrics row."""
    detail = run_detail(runs_dir, run_id) if _RUN_ID.match(run_id) else None
    if detail is None:
        raise NotFound(f"no run at /v1/runs/{run_id}", param="run_id")
    return detail


@router.get("/metrics")
def metrics(registry: Registry) -> Response:
    """The runs' latest round metrics, Prometheus text format."""
    return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)


def build_app(runs_dir: Path, registry: CollectorRegistry) -> FastAPI:
    """`GET /v1/runs`, `GET /v1/runs/{run_id}` as JSON and `GET /metrics` (what `registry` collects)."""
    app = FastAPI(title="BRIDGE trainer runs", version="1")
    app.state.runs_dir = runs_dir
    app.state.registry = registry
    install_error_handlers(app)
    app.include_router(router)
    return app
