"""Run questions through the live policy service, concurrently, under each evaluation mode."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence

import httpx
from tenacity import AsyncRetrying, retry_if_exception_type, stop_after_attempt, wait_random_exponential
from tqdm import tqdm

from services.common.schemas.policy import ORACLE_MODES, AgentMode, AgentQueryRequest, AgentQueryResponse
from services.common.schemas.retriever import DEFAULT_TOP_K
from services.data.datasets import EvalItem
from services.eval.scoring import ItemResult, answer_scores, cover_score, support_recall

MODES: tuple[AgentMode, ...] = ("direct", "naive-rag", "agent")  # the default; `oracle` is asked for by name


def oracle_doc_ids(item: EvalItem) -> list[str]:
    """What oracle mode shows a question: its supporting passages, each once, in the file's order."""
    return list(dict.fromkeys(item.supporting_doc_ids))


def request_for(item: EvalItem, mode: AgentMode, max_turns: int, top_k: int) -> AgentQueryRequest:
    """The question and, in the oracle modes only, the ids of its supporting passages: nothing else of the row (its
    answers, its other metadata) leaves this process."""
    oracle = oracle_doc_ids(item) if mode in ORACLE_MODES else None
    return AgentQueryRequest(question=item.question, max_turns=max_turns, top_k=top_k, mode=mode, oracle_doc_ids=oracle)


def score(item: EvalItem, mode: str, response: AgentQueryResponse, latency_s: float) -> ItemResult:
    """Recall and searches count the retriever's answers only: the oracle modes' given passages are neither (so their
    recall is that of the searches the policy made after reading them)."""
    steps = [turn.search for turn in response.turns if turn.search and turn.search.mode != "oracle"]
    retrieved = [doc["id"] for step in steps for doc in step.docs]
    em, f1 = answer_scores(response.answer or None, item)
    generated = "".join(turn.text for turn in response.turns)
    return ItemResult(
        dataset=item.dataset, mode=mode, id=item.id, question=item.question, golden_answers=item.golden_answers,
        answer=response.answer or None, em=em, f1=f1, cover=cover_score(generated, item),
        recall=None if mode == "direct" else support_recall(retrieved, item.supporting_doc_ids),
        retrieved_ids=retrieved, searches=len(steps),
        latency_s=latency_s, policy_version=response.policy_version, retriever_version=response.retriever_version,
        trajectory_id=response.trajectory_id,
    )  # fmt: skip


def failed(item: EvalItem, mode: str, error: str, latency_s: float) -> ItemResult:
    """A question the service could not answer counts as wrong, and is reported as an error."""
    return ItemResult(
        dataset=item.dataset, mode=mode, id=item.id, question=item.question, golden_answers=item.golden_answers,
        answer=None, em=0.0, f1=0.0, recall=None, retrieved_ids=[], searches=0, latency_s=latency_s, error=error,
    )  # fmt: skip


async def _ask(http: httpx.AsyncClient, request: AgentQueryRequest) -> AgentQueryResponse:
    # Only a connection that never reached the service is retried; a served error is a result.
    async for attempt in AsyncRetrying(
        retry=retry_if_exception_type((httpx.ConnectError, httpx.ConnectTimeout)),
        wait=wait_random_exponential(multiplier=0.5, max=10),
        stop=stop_after_attempt(5),
        reraise=True,
    ):
        with attempt:
            response = await http.post("/v1/agent/query", json=request.model_dump())
    response.raise_for_status()
    return AgentQueryResponse.model_validate(response.json())


async def evaluate(
    policy_url: str,
    work: Sequence[tuple[EvalItem, AgentMode]],
    *,
    concurrency: int = 16,
    max_turns: int = 4,
    top_k: int = DEFAULT_TOP_K,
    timeout_s: float = 900,
    headers: dict[str, str] | None = None,
    progress: bool = True,
    on_result: Callable[[ItemResult], None] | None = None,
) -> list[ItemResult]:
    """Every (item, mode) once, at most `concurrency` in flight; results in the order of `work`.
    `on_result` sees each result as it lands (the CLI appends it to results.jsonl, so a killed run keeps
    what it finished)."""
    gate = asyncio.Semaphore(concurrency)
    bar = tqdm(total=len(work), desc="evaluating", unit="q", disable=not progress)

    async def one(http: httpx.AsyncClient, item: EvalItem, mode: AgentMode) -> ItemResult:
        request = request_for(item, mode, max_turns, top_k)
        async with gate:
            started = time.perf_counter()
            try:
                result = score(item, mode, await _ask(http, request), time.perf_counter() - started)
            except httpx.HTTPStatusError as exc:
                detail = exc.response.text[:300]
                result = failed(item, mode, f"{exc.response.status_code}: {detail}", time.perf_counter() - started)
            except httpx.TransportError as exc:
                result = failed(item, mode, f"transport: {exc!r}", time.perf_counter() - started)
        if on_result is not None:
            on_result(result)
        bar.update()
        return result

    async with httpx.AsyncClient(base_url=policy_url, timeout=timeout_s, headers=headers or {}) as http:
        try:
            return await asyncio.gather(*(one(http, item, mode) for item, mode in work))
        finally:
            bar.close()
