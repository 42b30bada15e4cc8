"""Two bridge rounds on the real services (embedded mode) through a real Celery worker on Redis."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import httpx
import pytest

from tests.conftest import REPO, policy_env, start_service, stop_service

pytestmark = pytest.mark.slow


def test_two_bridge_rounds_publish_retriever_then_policy(tmp_path, retriever_factory, policy_models_root):
    from services.cli.ingest import ingest_file
    from services.common.clients.retriever import RetrieverClient

    checkpoints = tmp_path / "checkpoints"
    shared = {"BRIDGE_CHECKPOINT_DIR": str(checkpoints)}
    retriever = retriever_factory("trainer-retriever", **shared)
    with RetrieverClient(retriever.url, admin_token=retriever.token, timeout=600) as client:
        ingest_file(client, REPO / "services/cli/demo/hotpotqa_corpus.jsonl", progress=False)
    env = policy_env(policy_models_root, retriever.url, BRIDGE_POLICY_MAX_NEW_TOKENS="32", **shared)
    policy = start_service("policy", tmp_path / "policy", env, timeout=900)
    trainer_env = {
        **os.environ, **shared,
        "BRIDGE_DATA_DIR": str(tmp_path / "trainer"), "BRIDGE_ADMIN_TOKEN": policy.token,
        "REDIS_URL": env["REDIS_URL"], "BRIDGE_TRAINER_TRAJECTORY_STREAM": env["BRIDGE_POLICY_TRAJECTORY_STREAM"],
        "BRIDGE_TRAINER_POLICY_URL": policy.url, "BRIDGE_TRAINER_RETRIEVER_URL": retriever.url,
        "BRIDGE_TRAINER_POLICY_BASE_DIR": str(policy_models_root / "SmolLM2-135M-Instruct"),
        "BRIDGE_TRAINER_RETRIEVER_BASE_DIR": str(policy_models_root / "all-MiniLM-L6-v2"),
    }  # fmt: skip
    # A queue of this test's own, so a stray worker elsewhere on the broker never takes its tasks.
    log = (tmp_path / "worker.log").open("w")
    worker = subprocess.Popen([sys.executable, "-m", "services.cli.main", "worker"], env=trainer_env, cwd=REPO,
                              stdout=log, stderr=subprocess.STDOUT)  # fmt: skip
    try:
        run = subprocess.run(
            [sys.executable, "-m", "services.cli.main", "train", "--algo", "bridge", "--dataset", "hotpotqa",
             "--rounds", "2", "--questions-per-round", "4", "--group-size", "2", "--seed", "0", "--max-turns", "1",
             "--run-id", "it-bridge"],
            env=trainer_env, cwd=REPO, capture_output=True, text=True, timeout=1500,
        )  # fmt: skip
        assert run.returncode == 0, run.stdout + run.stderr + (tmp_path / "worker.log").read_text()[-3000:]
        print(run.stdout)
        rows = [json.loads(line) for line in (tmp_path / "trainer/runs/it-bridge/metrics.jsonl").open()]
        assert [r["round"] for r in rows] == [0, 1]
        for row in rows:
            assert row["activated_at"]["retriever"] < row["activated_at"]["policy"]  # retriever FIRST
            assert row["loss/bilevel_correction"] == row["loss/bilevel_correction"]  # finite, present
        assert rows[1]["lambda"] == rows[0]["lambda"] + 0.5
        ret = httpx.get(retriever.url + "/v1/checkpoints").json()
        pol = httpx.get(policy.url + "/v1/checkpoints").json()
        assert ret["active"] == "it-bridge-r1-retriever" and ret["previous"] == "it-bridge-r0-retriever"
        assert pol["active"] == "it-bridge-r1-policy" and pol["previous"] == "it-bridge-r0-policy"
        answer = httpx.post(policy.url + "/v1/agent/query", json={"question": "Who wrote Hamlet?", "max_turns": 1},
                            timeout=600).json()  # fmt: skip
        assert answer["policy_version"] == "it-bridge-r1-policy"
        assert answer["retriever_version"] == "it-bridge-r1-retriever"
    finally:
        worker.terminate()
        worker.wait(timeout=60)
        stop_service(policy)
