"""The agent as an OpenAI chat model (services/common/schemas/openai.py says what goes where). No FastAPI here."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from datetime import datetime

from services.common.schemas.agent_events import AnswerEvent, DeltaEvent, DocumentsEvent, DoneEvent, SearchEvent
from services.common.schemas.openai import (
    ACTIVE_MODEL,
    AssistantMessage,
    BridgeDoc,
    BridgeExtension,
    BridgeSearch,
    ChatChoice,
    ChatCompletionChunk,
    ChatCompletionRequest,
    ChatCompletionResponse,
    ChunkChoice,
    ChunkDelta,
    ModelCard,
    ModelList,
    Usage,
)
from services.common.schemas.policy import TrajectoryRecord
from services.policy.service import PolicyService


def _epoch(created_at: str | None) -> int:
    try:
        return int(datetime.fromisoformat(created_at).timestamp()) if created_at else 0
    except ValueError:
        return 0


def list_models(service: PolicyService) -> ModelList:
    listing = service.checkpoints.listing()
    active = next(c for c in listing.checkpoints if c.version == listing.active)
    cards = [ModelCard(id=ACTIVE_MODEL, created=_epoch(active.created_at), parent=listing.active)]
    cards += [ModelCard(id=c.version, created=_epoch(c.created_at), parent=c.parent) for c in listing.checkpoints]
    return ModelList(data=cards)


def pinned_version(request: ChatCompletionRequest) -> str | None:
    """None: the active version (leased when the request starts); otherwise the named one (404 if unknown)."""
    return None if request.model == ACTIVE_MODEL else request.model


def extension(record: TrajectoryRecord, timings: dict[str, float]) -> BridgeExtension:
    searches = []
    for index, turn in enumerate(record.turns):
        step = turn.search
        if step is None:
            continue
        scores = {str(c["id"]): float(c["score"]) for c in step.candidates}
        docs = [BridgeDoc(id=i, title=t, score=scores.get(i)) for i, t in zip(step.chosen_ids, step.chosen_titles,
                                                                                strict=False)]  # fmt: skip
        searches.append(BridgeSearch(turn=index, query=step.query, docs=docs, mode=step.mode, logprob=step.logprob,
                                     retriever_version=step.retriever_version))  # fmt: skip
    return BridgeExtension(
        trajectory_id=record.id,
        policy_version=record.policy_version,
        retriever_version=record.retriever_version,
        reasoning="".join(t.text for t in record.turns),
        turns=[t.text for t in record.turns],
        searches=searches,
        timings=timings,
    )


def usage(record: TrajectoryRecord) -> Usage:
    generated = sum(len(t.generated_ids) for t in record.turns)
    return Usage(prompt_tokens=len(record.prompt_ids), completion_tokens=generated,
                 total_tokens=len(record.prompt_ids) + generated)  # fmt: skip


def _finish(record: TrajectoryRecord) -> str:
    last = record.turns[-1].finish_reason if record.turns else None
    return "length" if last == "length" and record.answer is None else "stop"


async def complete(service: PolicyService, request: ChatCompletionRequest) -> ChatCompletionResponse:
    started = time.perf_counter()
    record, timings = await service.answer(request.to_agent_query(), version=pinned_version(request))
    return ChatCompletionResponse(
        id=f"chatcmpl-{record.id}",
        created=int(record.created_at),
        model=record.policy_version,
        choices=[ChatChoice(message=AssistantMessage(content=record.answer or ""), finish_reason=_finish(record))],
        usage=usage(record),
        bridge=extension(record, {**timings, "total_s": time.perf_counter() - started}),
    )


async def complete_stream(service: PolicyService, request: ChatCompletionRequest) -> AsyncIterator[ChatCompletionChunk]:
    """OpenAI chunks from the agent's events: the role, reasoning deltas, each search and its documents (as
    `bridge` events), the answer as content, then a last chunk with the finish reason and the whole extension."""
    created = int(time.time())
    chunk_id, model = "chatcmpl-pending", request.model

    def chunk(delta: ChunkDelta | None = None, **fields) -> ChatCompletionChunk:
        return ChatCompletionChunk(id=chunk_id, created=created, model=model,
                                   choices=[ChunkChoice(delta=delta or ChunkDelta())], **fields)  # fmt: skip

    events = service.query_stream(request.to_agent_query(), version=pinned_version(request))
    async for event in events:
        if event.type == "start":
            chunk_id, model = f"chatcmpl-{event.trajectory_id}", event.policy_version
            yield chunk(ChunkDelta(role="assistant", content=""))
        elif isinstance(event, DeltaEvent):
            yield chunk(ChunkDelta(reasoning_content=event.text))
        elif isinstance(event, SearchEvent | DocumentsEvent):
            yield chunk(bridge={"event": event.model_dump()})
        elif isinstance(event, AnswerEvent):
            yield chunk(ChunkDelta(content=event.answer))
        elif isinstance(event, DoneEvent):
            record = await service.trajectory(event.response.trajectory_id)
            last = chunk(bridge=extension(record, event.response.timings).model_dump())
            last.choices[0].finish_reason = _finish(record)
            yield last
            if request.stream_options is not None and request.stream_options.include_usage:
                yield ChatCompletionChunk(id=chunk_id, created=created, model=model, choices=[], usage=usage(record))
