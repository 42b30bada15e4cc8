"""The oracle modes on the policy service: the question's supporting passages, looked up in the real retriever by
id, are the trajectory's first <information> block, exactly as a search result is written (`oracle`: before the
first turn, as the scaffold writes a search; `oracle-search`: as the answer to the policy's own first search);
later searches go to the retriever; nothing of the question's metadata but those passages reaches the model; bad
oracle input is a 4xx.

The policy service runs in-process (its real app, routes and agent loop) on a scripted engine, a test double
that plays fixed turns through a byte-level tokenizer, so each test takes seconds; the retriever is the real
service (MiniLM, Qdrant Edge) as a subprocess, and Redis is real."""

from __future__ import annotations

import asyncio
import json
import os
import uuid
from pathlib import Path

import httpx
import pytest

from services.common.clients.retriever import RetrieverClient
from services.common.schemas.policy import AgentQueryResponse, TrajectoryRecord
from services.common.schemas.retriever import Document
from services.data.datasets import EvalItem, row_fields
from services.eval.runner import request_for, score
from services.modeling.prompt import format_information
from services.policy.backends.engine import Engine, Generation, SamplingSpec

pytestmark = pytest.mark.slow  # starts the retriever service (about 10 s)

DOCS = [
    Document(id="orc-alpha", title="Alpha River", text="The Alpha River flows through Betaland."),
    Document(id="orc-beta", title="Betaland", text="Betaland's capital is Gammaville."),
    Document(id="orc-delta", title="Delta Lake", text="Delta Lake is a lake far away from Betaland."),
    Document(id="orc-eps", title="Epsilon", text="Epsilon is a small mountain village."),
]
CANARY = "METADATA-CANARY-7f3a"
ROW = {
    "id": "q-oracle-1",
    "question": "What is the capital of the land the Alpha River flows through?",
    "golden_answers": ["Gammaville"],
    "dataset": "hotpotqa",
    "metadata": {"supporting_doc_ids": ["orc-beta", "orc-alpha"], "note": CANARY, "context_doc_ids": ["orc-eps"]},
}
# The scripted policy: it searches once after reading the given passages, then answers.
TURNS = ["<think> read them </think><search> Delta Lake </search>", "<think> ok </think><answer> Gammaville </answer>"]


def byte_tokenizer():
    """One token per byte (GPT-2's byte alphabet, no merges): decoding gives back exactly the text encoded."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    tok = Tokenizer(models.BPE(vocab={c: i for i, c in enumerate(alphabet)}, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    return PreTrainedTokenizerFast(tokenizer_object=tok)


class ScriptedEngine(Engine):
    """Plays `turns` in order (the next one each call), and keeps every context it was asked to continue."""

    def __init__(self, turns: list[str] = TURNS) -> None:
        self.tokenizer = byte_tokenizer()
        self.turns = turns
        self.contexts: list[list[int]] = []

    async def start(self) -> None:
        pass

    async def stop(self) -> None:
        pass

    async def generate(self, prompt_ids: list[int], spec: SamplingSpec, adapter: str) -> Generation:
        self.contexts.append(list(prompt_ids))
        text = self.turns[min(len(self.contexts), len(self.turns)) - 1]
        ids = self.tokenizer(text, add_special_tokens=False)["input_ids"]
        return Generation(token_ids=ids, logprobs=[-0.1] * len(ids), text=text, finish_reason="stop")

    async def load_adapter(self, name: str, path: Path) -> None:
        raise NotImplementedError

    async def unload_adapter(self, name: str) -> None:
        raise NotImplementedError


@pytest.fixture(scope="module")
def retriever(retriever_factory):
    service = retriever_factory("oracle-retriever")
    with RetrieverClient(service.url, admin_token=service.token, timeout=120) as client:
        client.upsert(DOCS)
    return service


def run_policy(retriever, tmp_path: Path, calls, turns: list[str] = TURNS):
    """The policy app in-process over `engine`, talking to the real retriever and Redis; `calls(http, engine,
    service)` is awaited with an HTTP client on the app."""
    from services.policy.app import build_app
    from services.policy.service import PolicyService
    from services.policy.settings import PolicySettings

    settings = PolicySettings(
        data_dir=tmp_path, engine="transformers", retriever_url=retriever.url, admin_token="test-admin-token",
        redis_url=os.environ.get("BRIDGE_TEST_REDIS_URL", "redis://127.0.0.1:6379/0"),
        trajectory_stream=f"bridge:test:{uuid.uuid4().hex[:8]}",
        feedback_stream=f"bridge:test-fb:{uuid.uuid4().hex[:8]}",
    )  # fmt: skip

    async def main():
        engine = ScriptedEngine(turns)
        service = PolicyService(settings, engine)
        await service.start()
        app = build_app(settings)
        app.state.service = service
        try:
            async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://policy") as http:
                return await calls(http, engine, service)
        finally:
            await service.stop()

    return asyncio.run(main())


def test_oracle_passages_are_the_first_information_block_and_nothing_else_leaks(retriever, tmp_path):
    item = EvalItem.model_validate(row_fields(ROW, "hotpotqa"))
    request = request_for(item, "oracle", max_turns=2, top_k=2)
    body = request.model_dump()
    # What crosses the wire: the question and the passage ids, never the answers or the rest of the metadata.
    assert body["oracle_doc_ids"] == ["orc-beta", "orc-alpha"] and CANARY not in json.dumps(body)
    assert "Gammaville" not in json.dumps(body) and "orc-eps" not in json.dumps(body)

    async def calls(http, engine, service):
        response = await http.post("/v1/agent/query", json=body)
        assert response.status_code == 200, response.text
        trajectory = await http.get(f"/v1/trajectories/{response.json()['trajectory_id']}")
        return response.json(), TrajectoryRecord.model_validate(trajectory.json()), engine

    answer, record, engine = run_policy(retriever, tmp_path, calls)
    decode = engine.tokenizer.decode
    first = record.turns[0]
    shown = [DOCS[1], DOCS[0]]  # the request's order
    assert record.mode == "oracle" and first.generated_ids == [] and first.search.mode == "oracle"
    assert first.search.chosen_ids == ["orc-beta", "orc-alpha"] and first.search.logprob is None
    # Written exactly as the scaffold writes a search with the question and its retrieval result.
    expected = f"<search> {ROW['question']} </search>" + format_information([(d.title, d.text) for d in shown])
    assert decode(first.observation_ids) == expected
    # The first generation continues from the prompt and that block, nothing in between.
    assert engine.contexts[0] == record.prompt_ids + first.observation_ids
    # The policy's own search then went to the retriever (greedy, served top-k) and was shown after.
    second = record.turns[1]
    assert second.search.mode == "greedy" and second.search.query == "Delta Lake" and len(second.search.chosen_ids) == 2
    assert second.search.chosen_ids[0] == "orc-delta" and second.search.candidates
    assert engine.contexts[1] == engine.contexts[0] + second.generated_ids + second.observation_ids
    assert record.answer == "Gammaville" and record.golden_answers is None
    # Nothing of the row but the passages' titles and texts is in anything the model read.
    context = decode(record.token_ids)
    for leak in (CANARY, "orc-beta", "orc-alpha", "orc-eps", "supporting_doc_ids"):
        assert leak not in context
    # The eval's row: the given passages are neither a search nor retrieval recall.
    response = AgentQueryResponse.model_validate(answer)
    assert [t.search.mode for t in response.turns if t.search] == ["oracle", "greedy"]
    result = score(item, "oracle", response, 1.0)
    assert result.em == 1.0 and result.searches == 1 and result.retrieved_ids == second.search.chosen_ids
    assert result.recall == 0.0  # the retriever's own search did not find the two supporting passages


def test_oracle_search_answers_the_policys_own_first_search_with_the_passages(retriever, tmp_path):
    """oracle-search: the policy writes its first search itself (as in agent mode) and the given passages are its
    result, so only the passages differ from agent mode; its next search goes to the retriever."""
    item = EvalItem.model_validate(row_fields(ROW, "hotpotqa"))
    body = request_for(item, "oracle-search", max_turns=2, top_k=2).model_dump()
    assert body["oracle_doc_ids"] == ["orc-beta", "orc-alpha"] and CANARY not in json.dumps(body)
    turns = ["<think> go </think><search> Alpha River </search>", *TURNS]

    async def calls(http, engine, service):
        response = await http.post("/v1/agent/query", json=body)
        assert response.status_code == 200, response.text
        trajectory = await http.get(f"/v1/trajectories/{response.json()['trajectory_id']}")
        return response.json(), TrajectoryRecord.model_validate(trajectory.json()), engine

    answer, record, engine = run_policy(retriever, tmp_path, calls, turns)
    decode = engine.tokenizer.decode
    first, second = record.turns[0], record.turns[1]
    shown = [DOCS[1], DOCS[0]]
    assert record.mode == "oracle-search" and decode(first.generated_ids) == turns[0]
    # The policy's own search, answered with the given passages: the block alone, no call written for it.
    assert first.search.mode == "oracle" and first.search.query == "Alpha River"
    assert first.search.chosen_ids == ["orc-beta", "orc-alpha"] and first.search.candidates == []
    assert decode(first.observation_ids) == format_information([(d.title, d.text) for d in shown])
    assert engine.contexts[0] == record.prompt_ids  # nothing before the policy's first turn
    assert engine.contexts[1] == record.prompt_ids + first.generated_ids + first.observation_ids
    # Its second search went to the retriever.
    assert second.search.mode == "greedy" and second.search.query == "Delta Lake"
    assert second.search.chosen_ids[0] == "orc-delta"
    assert record.answer == "Gammaville"
    result = score(item, "oracle-search", AgentQueryResponse.model_validate(answer), 1.0)
    assert result.em == 1.0 and result.searches == 1 and result.retrieved_ids == second.search.chosen_ids


@pytest.mark.parametrize(
    ("extra", "status", "reason"),
    [
        ({"mode": "oracle"}, 422, "oracle_doc_ids is required"),
        ({"mode": "oracle-search"}, 422, "oracle_doc_ids is required"),
        ({"mode": "agent", "oracle_doc_ids": ["orc-alpha"]}, 422, "refused in every other mode"),
        ({"mode": "oracle", "oracle_doc_ids": []}, 422, "at least 1"),
        ({"mode": "oracle", "oracle_doc_ids": ["orc-alpha", "orc-alpha"]}, 422, "must not repeat"),
        ({"mode": "oracle", "oracle_doc_ids": ["a b"]}, 422, "pattern"),
        ({"mode": "oracle", "oracle_doc_ids": [f"d{i}" for i in range(51)]}, 422, "at most 50"),
        ({"mode": "oracle", "oracle_doc_ids": ["orc-alpha", "no-such-doc"]}, 400, "not in the retriever's index"),
    ],
)
def test_bad_oracle_input_is_a_4xx_with_a_reason(retriever, tmp_path, extra, status, reason):
    async def calls(http, engine, service):
        bad = await http.post("/v1/agent/query", json={"question": ROW["question"], "max_turns": 1, **extra})
        good = await http.post("/v1/agent/query", json={"question": ROW["question"], "max_turns": 0})
        return bad, good, engine

    bad, good, engine = run_policy(retriever, tmp_path, calls)
    assert bad.status_code == status, bad.text
    assert reason in bad.json()["detail"]
    if status == 400:
        assert bad.json()["error"]["param"] == "oracle_doc_ids"
    assert len(engine.contexts) == 1  # the refused request generated nothing; the next one was served
    assert good.status_code == 200, good.text


def test_headroom_search_served_and_exact_on_the_real_retriever(retriever):
    """experiments.headroom's recall source: greedy top-k (HNSW) and `exact: true` (a full scan) over the same
    vectors; on four passages they agree, and the exact scan ranks like cosine over all of them."""
    from experiments.headroom import retrieval_recall, served_search

    search = served_search(retriever.url)
    served, exact = (
        search(["Delta Lake", "mountain village"], 3, False),
        search(["Delta Lake", "mountain village"], 3, True),
    )
    assert served == exact and [row[0] for row in exact] == ["orc-delta", "orc-eps"] and len(exact[0]) == 3
    items = [EvalItem.model_validate(row_fields(ROW, "hotpotqa"))]
    got = retrieval_recall(search, items, ks=(1, 4))
    assert got["served@4"] == got["exact@4"] == 1.0 and got["served@1"] == got["exact@1"] in (0.0, 0.5)
    bad = httpx.post(retriever.url + "/v1/search", json={"queries": ["x"], "exact": "sometimes"})
    assert bad.status_code == 422
