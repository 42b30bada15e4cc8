"""Events of a streamed agent query (`POST /v1/agent/query` with `"stream": true`), one per step, as
Server-Sent Events: `event: <type>` then `data: <this model as JSON>`.

Order: `start`, then per turn any number of `delta` (generated text as it comes), a `search` when the turn
asks the retriever and a `documents` when it answered; then `answer`, and last `done` (the very record the
non-streaming call returns). A failure after the stream began ends it with an `error` event instead.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, Field, TypeAdapter

from services.common.schemas.policy import AgentQueryResponse


class StartEvent(BaseModel):
    type: Literal["start"] = "start"
    trajectory_id: str
    question: str
    policy_version: str
    mode: str


class DeltaEvent(BaseModel):
    type: Literal["delta"] = "delta"
    turn: int
    text: str = Field(description="Generated text since the last delta of this turn (the policy's own tokens).")


class SearchEvent(BaseModel):
    type: Literal["search"] = "search"
    turn: int
    query: str


class RetrievedDoc(BaseModel):
    id: str
    title: str
    score: float
    text: str = Field("", description="The passage as the policy read it (in <information>).")


class DocumentsEvent(BaseModel):
    type: Literal["documents"] = "documents"
    turn: int
    query: str
    docs: list[RetrievedDoc]
    mode: str = Field(description="greedy (served top-k) or sample (Gumbel top-k over the candidates)")
    candidates: int = Field(description="How many candidates the retriever scored for this search.")
    logprob: float | None = Field(None, description="Plackett-Luce log-prob of the chosen set (sample mode)")
    retriever_version: str


class AnswerEvent(BaseModel):
    type: Literal["answer"] = "answer"
    answer: str
    reward: float | None = Field(None, description="Known only when gold answers are (later: POST /v1/feedback).")
    trajectory_id: str


class DoneEvent(BaseModel):
    type: Literal["done"] = "done"
    response: AgentQueryResponse


class ErrorEvent(BaseModel):
    type: Literal["error"] = "error"
    error: dict = Field(description="The error envelope every service answers with: {type, message, param, code}.")
    detail: str


AgentEvent = Annotated[
    StartEvent | DeltaEvent | SearchEvent | DocumentsEvent | AnswerEvent | DoneEvent | ErrorEvent,
    Field(discriminator="type"),
]
AGENT_EVENT = TypeAdapter(AgentEvent)


def sse_frame(event: BaseModel) -> str:
    """One Server-Sent Event: its type as the SSE event name, the model as the data line."""
    return f"event: {event.type}\ndata: {event.model_dump_json()}\n\n"
