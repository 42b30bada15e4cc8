"""`bridge-rl up` as a user runs it: health, a question over REST, one training round, a clean stop."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from tests.conftest import REPO, free_port

pytestmark = pytest.mark.slow


def processes_using(marker: str) -> list[int]:
    """Pids whose command line or environment mentions `marker` (our data dir)."""
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit() or int(proc.name) == os.getpid():
            continue
        try:
            blob = (proc / "cmdline").read_bytes() + (proc / "environ").read_bytes()
        except OSError:
            continue
        if marker.encode() in blob:
            found.append(int(proc.name))
    return found


def test_up_serves_trains_and_stops_cleanly(tmp_path, policy_models_root):
    data_dir = tmp_path / "home"
    (data_dir / "models").mkdir(parents=True)
    for name in ("SmolLM2-135M-Instruct", "all-MiniLM-L6-v2"):  # prepared once per machine; `up` finds them
        (data_dir / "models" / name).symlink_to(policy_models_root / name)
    policy_port, retriever_port = free_port(), free_port()
    env = {**os.environ, "BRIDGE_DATA_DIR": str(data_dir), "BRIDGE_POLICY_VLLM_PORT": str(free_port()),
           "BRIDGE_POLICY_MAX_NEW_TOKENS": "32", "VLLM_CACHE_ROOT": str(REPO / ".cache" / "vllm"),
           "BRIDGE_TRAINER_TRAJECTORY_STREAM": "bridge:trajectories",
           "BRIDGE_TRAINER_QUEUE": f"bridge-test-{free_port()}"}  # fmt: skip
    env.pop("BRIDGE_ADMIN_TOKEN", None)
    env.pop("REDIS_URL", None)
    log = (tmp_path / "up.log").open("w")
    up = subprocess.Popen(
        [sys.executable, "-m", "services.cli.main", "up", "--policy-port", str(policy_port),
         "--retriever-port", str(retriever_port), "--console-port", str(free_port())],
        env=env, cwd=REPO, stdout=log, stderr=subprocess.STDOUT,
    )  # fmt: skip
    policy = f"http://127.0.0.1:{policy_port}"
    try:
        deadline = time.monotonic() + 1200
        # The last lines `up` prints once everything is ready (a settings log line also says "admin token into").
        while "(or BRIDGE_ADMIN_TOKEN)" not in (tmp_path / "up.log").read_text():
            assert up.poll() is None, (tmp_path / "up.log").read_text()[-3000:]
            assert time.monotonic() < deadline, "bridge-rl up did not come up"
            time.sleep(1)
        token = (data_dir / "admin_token").read_text().strip()
        assert len(token) >= 32  # generated, and said where it is stored
        answer = httpx.post(policy + "/v1/agent/query", json={"question": "Who wrote Hamlet?", "max_turns": 1},
                            timeout=600)  # fmt: skip
        assert answer.status_code == 200 and answer.json()["policy_version"] == "base"

        redis_url = next(line.split()[-1] for line in (tmp_path / "up.log").read_text().splitlines()
                         if line.startswith("redis "))  # fmt: skip
        train_env = {**env, "REDIS_URL": redis_url, "BRIDGE_TRAINER_POLICY_URL": policy,
                     "BRIDGE_TRAINER_RETRIEVER_URL": f"http://127.0.0.1:{retriever_port}"}  # fmt: skip
        # `up` serves greedy retrieval: a live BRIDGE run could never train the retriever on it, so it is refused at
        # start, in one line, before anything is written or queued
        live = subprocess.run(
            [sys.executable, "-m", "services.cli.main", "train", "--source", "live", "--run-id", "up-live"],
            env=train_env, cwd=REPO, capture_output=True, text=True, timeout=300,
        )  # fmt: skip
        assert live.returncode == 2, live.stdout + live.stderr
        assert "Traceback" not in live.stderr and live.stderr.count("error:") == 1
        assert live.stderr.strip().splitlines()[-1].startswith("error: the policy service serves greedy retrieval")
        assert not (data_dir / "runs" / "up-live").exists()
        run = subprocess.run(
            [sys.executable, "-m", "services.cli.main", "train", "--rounds", "1", "--questions-per-round", "2",
             "--group-size", "2", "--max-turns", "1", "--run-id", "up-test"],
            env=train_env, cwd=REPO, capture_output=True, text=True, timeout=1200,
        )  # fmt: skip
        assert run.returncode == 0, run.stdout + run.stderr
        assert httpx.get(policy + "/v1/checkpoints").json()["active"] == "up-test-r0-policy"
        retriever = httpx.get(f"http://127.0.0.1:{retriever_port}/v1/checkpoints").json()
        # The warm start may answer without searching in one turn: a round with no sampled search publishes no
        # retriever (and says so); one with them publishes the new tower. Either way the services agree with it.
        [row] = [json.loads(line) for line in (data_dir / "runs/up-test/metrics.jsonl").open()]
        if row["searches/mean"] == 0:
            assert row["retriever_version"] is None and row["retriever_unchanged"] == "no sampled searches"
            assert retriever["active"] == "base" and "retriever: unchanged, no sampled searches" in run.stdout
        else:
            assert retriever["active"] == row["retriever_version"] == "up-test-r0-retriever"
    finally:
        up.send_signal(signal.SIGTERM)
        up.wait(timeout=180)
    assert up.returncode == 0, (tmp_path / "up.log").read_text()[-3000:]
    time.sleep(2)
    assert processes_using(str(data_dir)) == []  # no orphan: vLLM, services, worker, redis all gone
