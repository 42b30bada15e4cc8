"""Issue #7, security: admin token and optional API keys (401/403 with a reason), and schemathesis against
each service's OpenAPI finding no 5xx (admin routes included, with the token)."""

from __future__ import annotations

import subprocess
import sys
from xml.etree import ElementTree

import httpx
import pytest

from tests.conftest import policy_env, start_demo_retriever, start_service, stop_service

pytestmark = pytest.mark.slow

API_KEY = "test-api-key-1"


@pytest.fixture(scope="module")
def demo_retriever(retriever_factory):
    """This module's own: schemathesis posts, deletes and activates on it with the admin token."""
    return start_demo_retriever(retriever_factory)


@pytest.fixture(scope="module")
def keyed_policy(tmp_path_factory, policy_models_root, demo_retriever):
    """The cheapest real policy (transformers, 8 tokens a turn) with API keys on, one of them from a file."""
    data_dir = tmp_path_factory.mktemp("policy-keys")
    keys_file = data_dir / "api_keys"
    keys_file.write_text("# one key a line\ntest-api-key-2\n")
    env = policy_env(
        policy_models_root, demo_retriever.url, BRIDGE_POLICY_ENGINE="transformers",
        BRIDGE_POLICY_MAX_NEW_TOKENS="8", BRIDGE_POLICY_DTYPE="float32",
        BRIDGE_POLICY_API_KEYS=f"{API_KEY}, other-key", BRIDGE_POLICY_API_KEYS_FILE=str(keys_file),
        # Keep schemathesis's largest valid requests (8 turns of 10 docs, 2,000-char questions, 256 rollouts) to
        # seconds on 2 cores: the agent stops when its context is full, and rollouts are capped at 2 here.
        BRIDGE_POLICY_MAX_ROLLOUT_TRAJECTORIES="2", BRIDGE_POLICY_MAX_MODEL_LEN="512",
    )  # fmt: skip
    service = start_service("policy", data_dir, env, timeout=300)
    yield service
    stop_service(service)


def _detail(response: httpx.Response) -> str:
    body = response.json()
    assert body["detail"] == body["error"]["message"]
    return body["detail"]


def test_agent_endpoints_need_an_api_key_when_keys_are_set(keyed_policy):
    url = keyed_policy.url
    body = {"question": "Who wrote Hamlet?", "max_turns": 0}

    missing = httpx.post(url + "/v1/agent/query", json=body)
    assert missing.status_code == 401 and "X-API-Key" in _detail(missing)
    wrong = httpx.post(url + "/v1/agent/query", json=body, headers={"X-API-Key": API_KEY + "x"})
    assert wrong.status_code == 403 and "not valid" in _detail(wrong)
    bad_bearer = httpx.post(url + "/v1/agent/query", json=body, headers={"Authorization": "Bearer nope"})
    assert bad_bearer.status_code == 403
    for path in ("/v1/trajectories/abc", "/v1/feedback"):  # every agent route, not only query
        method = httpx.get if path.startswith("/v1/traj") else httpx.post
        kwargs = {} if method is httpx.get else {"json": {"trajectory_id": "abc", "reward": 1.0}}
        assert method(url + path, **kwargs).status_code == 401

    served = httpx.post(url + "/v1/agent/query", json=body, headers={"X-API-Key": API_KEY}, timeout=300)
    assert served.status_code == 200, served.text
    trajectory = served.json()["trajectory_id"]
    # A key from the keys file, and the admin token (what the trainer sends), are accepted too.
    assert httpx.get(f"{url}/v1/trajectories/{trajectory}", headers={"X-API-Key": "test-api-key-2"}).status_code == 200
    admin = {"Authorization": f"Bearer {keyed_policy.token}"}
    assert httpx.post(url + "/v1/feedback", json={"trajectory_id": trajectory, "reward": 1.0},
                      headers=admin).status_code == 200  # fmt: skip
    # The rollout cap of this deployment (2 trajectories) answers 400 with the reason.
    rollout = {"items": [{"id": "q", "question": "Who?", "golden_answers": ["x"]}], "group_size": 3, "max_turns": 0}
    capped = httpx.post(url + "/v1/agent/rollouts", json=rollout, headers=admin)
    assert capped.status_code == 400 and "at most 2" in _detail(capped)
    # The list of every user's trajectories is the admin token's only: an API key is not enough.
    as_key = httpx.get(url + "/v1/trajectories", headers={"X-API-Key": API_KEY})
    assert as_key.status_code == 401 and "admin" in _detail(as_key)
    listed = httpx.get(url + "/v1/trajectories", headers=admin)
    assert listed.status_code == 200 and trajectory in [t["id"] for t in listed.json()["trajectories"]]


def test_admin_endpoints_need_the_admin_token_not_an_api_key(keyed_policy, demo_retriever):
    for service in (keyed_policy, demo_retriever):
        missing = httpx.post(service.url + "/v1/checkpoints", json={"path": "x"})
        assert missing.status_code == 401 and "Bearer" in _detail(missing)
        assert missing.headers["www-authenticate"] == "Bearer"
        as_key = httpx.post(service.url + "/v1/checkpoints", json={"path": "x"},
                            headers={"Authorization": f"Bearer {API_KEY}", "X-API-Key": API_KEY})  # fmt: skip
        assert as_key.status_code == 403 and "admin token" in _detail(as_key)
        # With the token, the request reaches the handler: outside the checkpoint root is refused with 400.
        escape = httpx.post(service.url + "/v1/checkpoints", json={"path": "../../etc"},
                            headers={"Authorization": f"Bearer {service.token}"})  # fmt: skip
        assert escape.status_code == 400 and "inside the checkpoint root" in _detail(escape)
    doc = {"documents": [{"id": "sec-1", "title": "t", "text": "x"}]}
    assert httpx.post(demo_retriever.url + "/v1/documents", json=doc).status_code == 401
    assert httpx.delete(demo_retriever.url + "/v1/documents/sec-1").status_code == 401
    # Reading and searching stay open.
    assert httpx.get(keyed_policy.url + "/v1/checkpoints").status_code == 200
    assert httpx.post(demo_retriever.url + "/v1/search", json={"queries": ["film"]}).status_code == 200


def schemathesis(service_url: str, *headers: str, examples: int, tmp_path) -> tuple[subprocess.CompletedProcess, dict]:
    """The schemathesis CLI against a live service: positive and negative data, boundary values, only the
    'no 5xx' check (4xx answers to fuzzed bodies are the point). Returns the run and {operation: failed}."""
    args = [sys.executable, "-m", "schemathesis.cli", "run", f"{service_url}/openapi.json",
            "--checks", "not_a_server_error", "--phases", "examples,coverage,fuzzing",
            "--max-examples", str(examples), "--seed", "7", "--workers", "1", "--request-timeout", "120",
            "--suppress-health-check", "all", "--report", "junit", "--report-dir", str(tmp_path)]  # fmt: skip
    for header in headers:
        args += ["-H", header]
    run = subprocess.run(args, capture_output=True, text=True, timeout=900, cwd=tmp_path)  # it writes .schemathesis/
    print(run.stdout[-3000:])
    [report] = tmp_path.glob("junit-*.xml")
    cases = ElementTree.parse(report).getroot().iter("testcase")
    return run, {case.get("name"): case.find("failure") is not None for case in cases}


def test_schemathesis_finds_no_server_error_in_the_retriever(demo_retriever, tmp_path):
    run, operations = schemathesis(demo_retriever.url, f"Authorization: Bearer {demo_retriever.token}",
                                   examples=25, tmp_path=tmp_path)  # fmt: skip
    assert run.returncode == 0 and not any(operations.values()), run.stdout[-6000:] + run.stderr[-2000:]
    # It really exercised the admin routes (with the token) and the search path.
    for operation in ("POST /v1/documents", "DELETE /v1/documents/{doc_id}", "POST /v1/checkpoints",
                      "POST /v1/checkpoints/{version}/activate", "POST /v1/search", "POST /retrieve"):  # fmt: skip
        assert operation in operations
    assert httpx.get(demo_retriever.url + "/readyz").status_code == 200  # still serving afterwards


def test_schemathesis_finds_no_server_error_in_the_policy(keyed_policy, tmp_path):
    run, operations = schemathesis(keyed_policy.url, f"Authorization: Bearer {keyed_policy.token}",
                                   f"X-API-Key: {API_KEY}", examples=5, tmp_path=tmp_path)  # fmt: skip
    assert run.returncode == 0 and not any(operations.values()), run.stdout[-6000:] + run.stderr[-2000:]
    for operation in ("POST /v1/agent/query", "POST /v1/agent/rollouts", "POST /v1/feedback",
                      "GET /v1/trajectories/{trajectory_id}", "POST /v1/checkpoints"):  # fmt: skip
        assert operation in operations
    assert httpx.get(keyed_policy.url + "/readyz").status_code == 200
