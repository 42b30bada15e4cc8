"""Issue #15: a streamed agent query (SSE), a client that goes away mid-answer, and the OpenAI-compatible endpoint
driven by the real `openai` client, on a real policy (transformers engine), retriever and Redis, API keys on."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import httpx
import openai
import pytest

from services.common.schemas.agent_events import AGENT_EVENT
from services.common.schemas.policy import AgentQueryResponse, TrajectoryRecord
from tests.conftest import REPO, policy_env, start_service, stop_service

pytestmark = pytest.mark.slow
API_KEY = "stream-test-key"
QUESTION = json.loads((REPO / "services/demo_data/hotpotqa_train.jsonl").open().readline())["question"]


@pytest.fixture(scope="module")
def policy(tmp_path_factory, policy_models_root, demo_retriever):
    env = policy_env(
        policy_models_root, demo_retriever.url, BRIDGE_POLICY_ENGINE="transformers",
        BRIDGE_POLICY_MAX_NEW_TOKENS="16", BRIDGE_POLICY_DTYPE="float32", BRIDGE_POLICY_API_KEYS=API_KEY,
    )  # fmt: skip
    service = start_service("policy", tmp_path_factory.mktemp("policy-stream"), env, timeout=300)
    yield service
    stop_service(service)


KEY = {"X-API-Key": API_KEY}


def sse_events(response: httpx.Response) -> list:
    events, name = [], None
    for line in response.iter_lines():
        if line.startswith("event: "):
            name = line.removeprefix("event: ")
        elif line.startswith("data: "):
            event = AGENT_EVENT.validate_json(line.removeprefix("data: "))
            assert event.type == name
            events.append(event)
    return events


def trajectory(policy, trajectory_id: str) -> TrajectoryRecord:
    response = httpx.get(f"{policy.url}/v1/trajectories/{trajectory_id}", headers=KEY)
    assert response.status_code == 200, response.text
    return TrajectoryRecord.model_validate(response.json())


def test_streamed_query_sends_each_step_then_the_same_record_as_a_plain_query(policy):
    body = {"question": QUESTION, "max_turns": 0}  # the initial search, then one generation
    with httpx.stream("POST", policy.url + "/v1/agent/query", json={**body, "stream": True}, headers=KEY,
                      timeout=300) as response:  # fmt: skip
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        events = sse_events(response)
    kinds = [e.type for e in events]
    assert kinds[0] == "start" and kinds[-2:] == ["answer", "done"], kinds
    assert "delta" in kinds and "search" in kinds and kinds.index("search") < kinds.index("documents")
    docs = next(e for e in events if e.type == "documents")
    assert len(docs.docs) == 3 and all(d.title and d.score is not None for d in docs.docs)
    assert docs.mode == "greedy" and docs.retriever_version == "base"
    done = events[-1].response
    assert isinstance(done, AgentQueryResponse) and done.trajectory_id == events[0].trajectory_id
    # The deltas of each turn join into that turn's text.
    for i, turn in enumerate(done.turns):
        assert "".join(e.text for e in events if e.type == "delta" and e.turn == i) == turn.text
    assert events[-2].answer == done.answer

    plain = httpx.post(policy.url + "/v1/agent/query", json=body, headers=KEY, timeout=300)
    assert plain.status_code == 200, plain.text
    plain = AgentQueryResponse.model_validate(plain.json())
    # Greedy decoding: the same question gives the same record, streamed or not.
    assert plain.turns == done.turns and plain.answer == done.answer
    record = trajectory(policy, done.trajectory_id)
    assert record.status == "complete" and record.answer == (done.answer or None)


def test_a_client_that_goes_away_cancels_and_its_trajectory_is_recorded_cut_short(policy):
    body = {"question": QUESTION, "max_turns": 4, "stream": True}
    with httpx.stream("POST", policy.url + "/v1/agent/query", json=body, headers=KEY, timeout=300) as response:
        lines = response.iter_lines()
        start = None
        for line in lines:
            if line.startswith("data: ") and start is None:
                start = json.loads(line.removeprefix("data: "))
            if line == "event: delta":
                break  # mid-generation: hang up
    trajectory_id = start["trajectory_id"]
    deadline = time.monotonic() + 60
    while True:
        got = httpx.get(f"{policy.url}/v1/trajectories/{trajectory_id}", headers=KEY)
        if got.status_code == 200 or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert got.status_code == 200, got.text
    record = TrajectoryRecord.model_validate(got.json())
    assert record.status == "cancelled" and record.answer is None
    # Whole turns only: every kept turn has its tokens and their log-probs; the interrupted one is not there.
    assert len(record.turns) < 5
    for turn in record.turns:
        assert len(turn.generated_ids) == len(turn.generated_logprobs)
    # It has no answer to reward, so live learning never sees it.
    refused = httpx.post(policy.url + "/v1/feedback", json={"trajectory_id": trajectory_id, "reward": 1.0}, headers=KEY)
    assert refused.status_code == 409 and "cut short" in refused.json()["detail"]
    # The generation stopped with the client: the next question is served at once, not after 4 more turns.
    started = time.perf_counter()
    quick = httpx.post(policy.url + "/v1/agent/query", json={"question": "Who?", "mode": "direct"}, headers=KEY,
                       timeout=300)  # fmt: skip
    assert quick.status_code == 200 and time.perf_counter() - started < 30


def client(policy, key: str = API_KEY) -> openai.OpenAI:
    return openai.OpenAI(base_url=policy.url + "/v1", api_key=key, max_retries=0, timeout=300)


def test_openai_client_chat_completion(policy):
    completion = client(policy).chat.completions.create(
        model="bridge",
        messages=[{"role": "system", "content": "be brief"}, {"role": "user", "content": QUESTION}],
        extra_body={"max_turns": 0},
    )
    bridge = completion.model_extra["bridge"]
    record = trajectory(policy, bridge["trajectory_id"])
    assert completion.object == "chat.completion" and completion.model == "base"
    assert completion.choices[0].message.role == "assistant"
    assert completion.choices[0].message.content == (record.answer or "")
    assert bridge["reasoning"] == "".join(t.text for t in record.turns)
    assert bridge["searches"] and bridge["searches"][0]["docs"][0]["title"]
    assert bridge["searches"][0]["docs"][0]["score"] is not None
    assert completion.usage.completion_tokens == sum(len(t.generated_ids) for t in record.turns)
    models = [m.id for m in client(policy).models.list()]
    assert models[:2] == ["bridge", "base"]


def test_openai_client_streaming(policy):
    stream = client(policy).chat.completions.create(
        model="base", messages=[{"role": "user", "content": QUESTION}], stream=True,
        stream_options={"include_usage": True}, extra_body={"max_turns": 0},
    )  # fmt: skip
    chunks = list(stream)
    content = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    reasoning = "".join((c.choices[0].delta.model_extra or {}).get("reasoning_content") or "" for c in chunks
                        if c.choices)  # fmt: skip
    last = next(c for c in reversed(chunks) if c.choices)
    assert last.choices[0].finish_reason in ("stop", "length")
    bridge = last.model_extra["bridge"]
    record = trajectory(policy, bridge["trajectory_id"])
    assert content == (record.answer or "") and reasoning == bridge["reasoning"]
    assert any((c.model_extra or {}).get("bridge", {}).get("event", {}).get("type") == "documents" for c in chunks)
    assert chunks[-1].usage.completion_tokens == sum(len(t.generated_ids) for t in record.turns)
    assert {c.id for c in chunks} == {f"chatcmpl-{record.id}"}


def test_openai_errors_and_auth(policy):
    messages = [{"role": "user", "content": "Who wrote Hamlet?"}]
    with pytest.raises(openai.PermissionDeniedError) as wrong:
        client(policy, "not-a-key").chat.completions.create(model="bridge", messages=messages)
    assert wrong.value.body["code"] == "invalid_api_key" and wrong.value.body["type"] == "permission_error"
    with pytest.raises(openai.NotFoundError) as unknown:
        client(policy).chat.completions.create(model="no-such-version", messages=messages)
    assert unknown.value.body["code"] == "model_not_found" and unknown.value.body["param"] == "model"
    with pytest.raises(openai.BadRequestError) as bad:
        client(policy).chat.completions.create(model="bridge", messages=[{"role": "system", "content": "x"}])
    assert "last user message" in bad.value.body["message"]
    raw = httpx.post(policy.url + "/v1/chat/completions", json={"model": "bridge", "messages": messages})
    assert raw.status_code == 401 and set(raw.json()) == {"error"}
    assert set(raw.json()["error"]) == {"message", "type", "param", "code"}
    # The admin token and X-API-Key are accepted as on the other agent routes.
    admin = client(policy, policy.token).chat.completions.create(model="bridge", messages=messages,
                                                                 extra_body={"mode": "direct"})  # fmt: skip
    assert admin.choices[0].message.role == "assistant"


def test_cli_ask_streams_and_a_refusal_is_one_line(policy):
    env = {**os.environ, "BRIDGE_API_KEY": API_KEY}
    cli = [sys.executable, "-m", "services.cli.main", "ask", "Who wrote Hamlet?", "--url", policy.url,
           "--max-turns", "0"]  # fmt: skip
    run = subprocess.run(cli, env=env, capture_output=True, text=True, timeout=300, cwd=REPO)
    assert run.returncode == 0, run.stderr
    assert "search" in run.stdout and "answer" in run.stdout and "trajectory" in run.stdout
    refused = subprocess.run(cli, env={**env, "BRIDGE_API_KEY": "wrong"}, capture_output=True, text=True,
                             timeout=300, cwd=REPO)  # fmt: skip
    assert refused.returncode == 1
    assert refused.stderr.strip().count("\n") == 0 and "API key is not valid" in refused.stderr
    assert "Traceback" not in refused.stderr + refused.stdout
