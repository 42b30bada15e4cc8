"""The agent loop's retrieval seeds: each search of a seeded rollout draws from a seed of its own."""

from __future__ import annotations

import asyncio

import pytest
from transformers import AutoTokenizer

from services.common.schemas.retriever import Candidate, ScoredDoc, SearchResponse, SearchResult
from services.policy.agent import AgentRunner, AgentTask, RetrievalSpec
from services.policy.backends.engine import Engine, Generation, SamplingSpec


class ScriptedEngine(Engine):
    """Searches once, then answers: the two turns every seeded rollout with the scaffold has."""

    def __init__(self, tokenizer) -> None:
        self.tokenizer = tokenizer
        self.calls = 0

    async def start(self) -> None: ...

    async def stop(self) -> None: ...

    async def load_adapter(self, name: str, path) -> None: ...

    async def unload_adapter(self, name: str) -> None: ...

    async def generate(self, prompt_ids: list[int], spec: SamplingSpec, adapter: str) -> Generation:
        self.calls += 1
        text = "<search> capital of France </search>" if self.calls == 1 else "<answer> Paris </answer>"
        ids = self.tokenizer(text, add_special_tokens=False)["input_ids"]
        return Generation(ids, [-0.1] * len(ids), text, "stop")


class RecordingRetriever:
    """Answers every search with the same two documents and records the seed and version it was asked for."""

    def __init__(self) -> None:
        self.calls: list[dict] = []

    async def search(self, queries: list[str], **params) -> SearchResponse:
        self.calls.append(params)
        docs = [ScoredDoc(id="d0", title="Paris", text="Paris is the capital of France.", score=0.9)]
        result = SearchResult(query=queries[0], docs=docs, candidates=[Candidate(id="d0", score=0.9)], logprob=-0.1)
        return SearchResponse(retriever_version=params.get("version") or "base", results=[result] * len(queries))


@pytest.fixture(scope="module")
def tokenizer(policy_models_root):
    return AutoTokenizer.from_pretrained(str(policy_models_root / "SmolLM2-135M-Instruct"))


def test_scaffold_and_model_searches_draw_from_distinct_seeds(tokenizer):
    retriever = RecordingRetriever()
    runner = AgentRunner(ScriptedEngine(tokenizer), retriever, max_new_tokens=32, max_model_len=2048)
    spec = RetrievalSpec(top_k=1, mode="sample", candidates=1, temperature=0.05)
    records = asyncio.run(runner.run([AgentTask("What is the capital of France?", seed=3)], adapter="base",
                                     policy_version="base", temperature=1.0, max_turns=2, retrieval=spec,
                                     retrieval_seed=7, initial_search=True))  # fmt: skip
    seeds = [call["seed"] for call in retriever.calls]
    assert len(seeds) == 2 and len(set(seeds)) == 2, seeds  # the scaffold's and the model's first search
    assert [t.search.turn for t in records[0][0].turns if t.search] == [0, 0]
