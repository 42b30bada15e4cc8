"""A round step that meets a transient upstream failure is retried by the real Celery worker (on the real Redis)
instead of failing the run; a permanent one still fails the run at once, and so does a transient one that outlasts
the retry cap.

The upstream is a small real HTTP server standing in for the policy service's checkpoint endpoints; the step is
`trainer.round.publish` of a round whose training output (trained.json) the test writes, so no model is loaded."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
import uuid
from collections import defaultdict
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
import redis

from services.common.checkpoints import write_json_atomic
from services.trainer.algo.config import AlgoConfig
from services.trainer.celery_app import make_celery
from services.trainer.round_files import start_run
from services.trainer.run_state import RunConfig, RunState
from services.trainer.settings import TrainerSettings
from tests.conftest import REPO

REDIS_URL = os.environ.get("BRIDGE_TEST_REDIS_URL", "redis://127.0.0.1:6379/0")
RETRY_MAX = 3


class FlakyPolicy(ThreadingHTTPServer):
    """Answers POST /v1/checkpoints with the statuses scripted for the checkpoint's version, in turn (the last one
    repeats), and POST /v1/checkpoints/{version}/activate with 200; records every call."""

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.scripts: dict[str, list[int]] = {}
        self.calls: dict[str, list[tuple[str, int]]] = defaultdict(list)
        self.lock = threading.Lock()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"


class _Handler(BaseHTTPRequestHandler):
    server: FlakyPolicy

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers.get("content-length", 0))) or b"{}")
        if self.path == "/v1/checkpoints":
            version = body["path"]
            with self.server.lock:
                script = self.server.scripts[version]
                status = script[min(len(self.server.calls[version]), len(script) - 1)]
                self.server.calls[version].append(("register", status))
            if status == 200:
                self._answer(200, {"kind": "policy-lora", "version": version, "files": {}})
            else:
                self._answer(status, {"detail": f"scripted {status} for {version}"})
        elif self.path.startswith("/v1/checkpoints/") and self.path.endswith("/activate"):
            version = self.path.split("/")[3]
            with self.server.lock:
                self.server.calls[version].append(("activate", 200))
            self._answer(200, {"active": version, "previous": "base", "status": "active"})
        else:
            self._answer(404, {"detail": "not found"})

    def _answer(self, status: int, body: dict) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args) -> None:
        pass


@pytest.fixture(scope="module")
def setup(tmp_path_factory) -> Iterator[dict]:
    try:
        redis.Redis.from_url(REDIS_URL).ping()
    except redis.exceptions.ConnectionError:
        pytest.skip(f"no Redis at {REDIS_URL}")
    tmp_path = tmp_path_factory.mktemp("trainer-retry")
    policy = FlakyPolicy()
    threading.Thread(target=policy.serve_forever, daemon=True).start()
    tag = uuid.uuid4().hex[:8]
    env = {
        "BRIDGE_DATA_DIR": str(tmp_path / "trainer"), "BRIDGE_ADMIN_TOKEN": "test-admin-token",
        "REDIS_URL": REDIS_URL, "BRIDGE_TRAINER_QUEUE": f"bridge-test-retry-{tag}",
        "BRIDGE_TRAINER_TRAJECTORY_STREAM": f"bridge:test-retry:{tag}", "BRIDGE_TRAINER_POLICY_URL": policy.url,
        "BRIDGE_TRAINER_METRICS_PORT": "0", "BRIDGE_TRAINER_RETRY_MAX": str(RETRY_MAX),
        "BRIDGE_TRAINER_RETRY_BACKOFF_S": "1", "BRIDGE_TRAINER_RETRY_BACKOFF_MAX_S": "2",
        "BRIDGE_TRAINER_RETRY_JITTER": "false",
    }  # fmt: skip
    log_path = tmp_path / "worker.log"
    with log_path.open("w") as log:
        worker = subprocess.Popen([sys.executable, "-m", "services.cli.main", "worker"], env={**os.environ, **env},
                                  cwd=REPO, stdout=log, stderr=subprocess.STDOUT)  # fmt: skip
    settings = TrainerSettings(**_settings_kwargs(env))
    yield {"policy": policy, "settings": settings, "worker": worker, "log": log_path}
    worker.terminate()
    try:
        worker.wait(timeout=30)
    except subprocess.TimeoutExpired:
        worker.kill()
        worker.wait()
    policy.shutdown()
    redis.Redis.from_url(REDIS_URL).delete(env["BRIDGE_TRAINER_TRAJECTORY_STREAM"])  # this test's own stream


def _settings_kwargs(env: dict[str, str]) -> dict:
    return {
        "data_dir": env["BRIDGE_DATA_DIR"], "admin_token": env["BRIDGE_ADMIN_TOKEN"], "redis_url": REDIS_URL,
        "queue": env["BRIDGE_TRAINER_QUEUE"], "trajectory_stream": env["BRIDGE_TRAINER_TRAJECTORY_STREAM"],
        "policy_url": env["BRIDGE_TRAINER_POLICY_URL"], "metrics_port": 0,
    }  # fmt: skip


def _publish_trained_round(setup: dict, run_id: str, statuses: list[int]) -> RunState:
    """A one-round search-r1 run whose round 0 is trained (its trained.json written here); the worker publishes it
    to the stand-in policy, which answers `statuses` to the register call. Returns the run's final state."""
    settings: TrainerSettings = setup["settings"]
    version = f"{run_id}-r0-policy"
    setup["policy"].scripts[version] = statuses
    config = RunConfig(run_id=run_id, dataset="hotpotqa", rounds=1, questions_per_round=1,
                       algo=AlgoConfig(algo="search-r1"))  # fmt: skip
    start_run(settings, config)
    folder = settings.runs_dir / run_id / "round-0000"
    folder.mkdir(parents=True, exist_ok=True)
    write_json_atomic(folder / "trained.json", {
        "retriever": None, "policy": version, "entry_ids": [], "stats": {"loss/policy": 0.1},
        "rollout_metrics": {"reward/mean": 0.5}, "time/train_s": 1.0, "memory/peak_mb": 1.0,
        "policy_rollouts": "reweighted", "policy_step/rollouts": f"{run_id}/r0", "policy_step/trajectories": [],
    })  # fmt: skip
    make_celery(settings).send_task("trainer.round.publish", args=[run_id, 0, "round"])
    deadline = time.monotonic() + 120  # the worker's start-up (imports) included
    while (state := RunState.load(settings.runs_dir, run_id)).status == "running":
        assert setup["worker"].poll() is None, setup["log"].read_text()[-3000:]
        assert time.monotonic() < deadline, setup["log"].read_text()[-3000:]
        time.sleep(0.2)
    return state


def test_a_503_during_publish_is_retried_and_the_run_completes(setup):
    run_id = f"retry-ok-{uuid.uuid4().hex[:6]}"
    state = _publish_trained_round(setup, run_id, [503, 503, 200])
    assert state.status == "done", state.error
    assert state.error is None and state.policy_version == f"{run_id}-r0-policy"
    calls = setup["policy"].calls[f"{run_id}-r0-policy"]
    assert calls == [("register", 503), ("register", 503), ("register", 200), ("activate", 200)]
    retried = [line for line in setup["log"].read_text().splitlines() if "retry: Retry in" in line and run_id in line]
    assert len(retried) == 2  # celery's own record of each retry it scheduled
    assert "Retry in 1s" in retried[0] and "Retry in 2s" in retried[1]  # the backoff doubles


def test_a_4xx_fails_the_run_at_once_with_its_reason(setup):
    run_id = f"retry-4xx-{uuid.uuid4().hex[:6]}"
    state = _publish_trained_round(setup, run_id, [400, 200])
    assert state.status == "failed"
    assert "publish round 0 (round)" in state.error and "400" in state.error and "transient" not in state.error
    assert setup["policy"].calls[f"{run_id}-r0-policy"] == [("register", 400)]  # no retry


def test_a_transient_failure_that_outlasts_the_retries_fails_the_run(setup):
    run_id = f"retry-down-{uuid.uuid4().hex[:6]}"
    state = _publish_trained_round(setup, run_id, [503])
    assert state.status == "failed"
    assert f"transient, after {RETRY_MAX} retries" in state.error and "503" in state.error
    assert setup["policy"].calls[f"{run_id}-r0-policy"] == [("register", 503)] * (RETRY_MAX + 1)
