"""The baseline for bench/agent.py: the same Search-R1 loop, one question at a time, in a plain loop,
straight against the same vLLM server and retriever (no service, no batching, no concurrency)."""

from __future__ import annotations

import httpx
from transformers import PreTrainedTokenizerBase

from services.common.answers import extract_answer
from services.modeling.prompt import ANSWER_STOP, SEARCH_STOP, build_prompt, format_information, parse_search


def answer(
    question: str,
    tokenizer: PreTrainedTokenizerBase,
    vllm: httpx.Client,
    retriever: httpx.Client,
    *,
    max_turns: int,
    max_tokens: int,
    top_k: int = 3,
) -> tuple[str | None, int]:
    """Returns (answer, generated token count)."""

    def search(query: str) -> str:
        docs = retriever.post("/retrieve", json={"queries": [query], "topk": top_k}).json()["result"][0]
        return format_information([tuple(d["contents"].split("\n", 1)) for d in docs])

    context = build_prompt(tokenizer, question) + f"<search> {question} </search>" + search(question)
    generated, produced = "", 0
    for turn in range(max_turns + 1):
        stop = [ANSWER_STOP] if turn == max_turns else [SEARCH_STOP, ANSWER_STOP]
        body = {
            "model": "base",
            "prompt": context,
            "max_tokens": max_tokens,
            "temperature": 0.0,
            "stop": stop,
            "include_stop_str_in_output": True,
        }
        choice = vllm.post("/v1/completions", json=body).json()
        text = choice["choices"][0]["text"]
        produced += choice["usage"]["completion_tokens"]
        generated += text
        context += text
        query = None if turn == max_turns else parse_search(text)
        if query is None:
            break
        context += search(query)
    return extract_answer(generated), produced
