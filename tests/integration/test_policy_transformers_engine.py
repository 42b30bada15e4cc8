"""The same agent on the transformers engine (for machines where vLLM can't run)."""

from __future__ import annotations

import json

import httpx
import pytest
import torch

from services.common.schemas.policy import TrajectoryRecord
from tests.conftest import REPO, policy_env, start_service, stop_service

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def hf_policy(tmp_path_factory, policy_models_root, demo_retriever):
    env = policy_env(
        policy_models_root, demo_retriever.url, BRIDGE_POLICY_ENGINE="transformers",
        BRIDGE_POLICY_MAX_NEW_TOKENS="24", BRIDGE_POLICY_DTYPE="float32",
        BRIDGE_POLICY_SERVE_RETRIEVAL="sample", BRIDGE_POLICY_SERVE_RETRIEVAL_SHARE="1",
    )  # fmt: skip
    service = start_service("policy", tmp_path_factory.mktemp("policy-hf"), env, timeout=300)
    service.env = env
    yield service
    stop_service(service)


def test_rollout_end_to_end_with_exact_logprobs(hf_policy):
    from transformers import AutoModelForCausalLM

    q = json.loads((REPO / "services/demo_data/hotpotqa_train.jsonl").open().readline())
    body = {
        "items": [{"id": q["id"], "question": q["question"], "golden_answers": q["golden_answers"]}],
        "group_size": 2,
        "seed": 1,
        "max_turns": 1,
    }
    response = httpx.post(hf_policy.url + "/v1/agent/rollouts", json=body, timeout=600)
    assert response.status_code == 200, response.text
    summaries = response.json()["trajectories"]
    assert len(summaries) == 2
    record = TrajectoryRecord.model_validate(
        httpx.get(f"{hf_policy.url}/v1/trajectories/{summaries[0]['trajectory_id']}").json()
    )
    assert record.turns[0].search is not None and record.turns[0].observation_ids
    assert sum(record.generated_mask) == sum(len(t.generated_ids) for t in record.turns) > 0

    model = AutoModelForCausalLM.from_pretrained(hf_policy.env["BRIDGE_POLICY_MODEL_DIR"], dtype=torch.float32)
    ids = torch.tensor([record.token_ids])
    with torch.no_grad():
        logps = torch.log_softmax(model(ids).logits[0, :-1], dim=-1).gather(1, ids[0, 1:, None])[:, 0]
    mask = torch.tensor(record.generated_mask[1:], dtype=torch.bool)
    behaviour = torch.tensor([lp for t in record.turns for lp in t.generated_logprobs])
    # Same weights, same dtype, one process: only kernel-order noise (incremental decoding vs one pass).
    assert (logps[mask] - behaviour).abs().max() < 1e-2


def test_query_answers_and_names_versions(hf_policy):
    response = httpx.post(hf_policy.url + "/v1/agent/query", json={"question": "Who wrote Hamlet?", "max_turns": 1},
                          timeout=600)  # fmt: skip
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["policy_version"] == "base" and body["retriever_version"] == "base"
    assert body["turns"][0]["search"]["query"] == "Who wrote Hamlet?"


def test_served_queries_explore_retrieval_with_their_propensity_logged(hf_policy):
    """Every served query explores here (share 1; the share's draw: tests/unit/policy/test_serving.py): M
    candidates, a draw at the configured temperature, its Plackett-Luce log-prob in the trajectory."""
    serving = httpx.get(hf_policy.url + "/v1/serving").json()
    assert serving == {"temperature": 0.0, "retrieval": "sample", "retrieval_share": 1.0, "retrieval_candidates": 20,
                       "retrieval_temperature": 0.05}  # fmt: skip
    body = httpx.post(hf_policy.url + "/v1/agent/query", json={"question": "Who wrote Hamlet?", "mode": "naive-rag"},
                      timeout=600).json()  # fmt: skip
    record = httpx.get(f"{hf_policy.url}/v1/trajectories/{body['trajectory_id']}").json()
    [step] = [t["search"] for t in record["turns"] if t["search"]]
    assert step["mode"] == "sample" and len(step["candidates"]) == 20 and step["temperature"] == 0.05
    assert step["logprob"] < 0 and len(step["chosen_ids"]) == 3
