"""OpenAI-compatible wire models of the policy service: `POST /v1/chat/completions` and `GET /v1/models`.

The agent is the model: the last user message is the question, `model` names a policy version (or `bridge`,
the active one), and the assistant message's content is the final answer. Everything else the agent did (its
reasoning, each search, the documents it read, the trajectory id and both versions) is in the `bridge`
extension field of the completion, and of the last chunk when streaming; streamed chunks carry the reasoning
as `delta.reasoning_content` (the field reasoning models use) and each retrieval as a `bridge` event.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from services.common.schemas.policy import MAX_QUESTION_CHARS, MAX_TURNS, AgentQueryRequest, QuestionMode
from services.common.schemas.retriever import DEFAULT_TOP_K, MAX_AGENT_TOP_K

ACTIVE_MODEL = "bridge"  # `model` alias for whichever policy version is active


class ContentPart(BaseModel):
    model_config = ConfigDict(extra="ignore")

    type: str = Field(max_length=64)
    text: str | None = Field(None, max_length=MAX_QUESTION_CHARS)


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="ignore")

    role: Literal["system", "developer", "user", "assistant", "tool", "function"]
    content: str | list[ContentPart] | None = Field(None)

    @property
    def text(self) -> str:
        if isinstance(self.content, list):
            return "".join(p.text or "" for p in self.content if p.type == "text")
        return self.content or ""


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="ignore")

    include_usage: bool = False


class ChatCompletionRequest(BaseModel):
    """OpenAI's body. Sampling fields a client may send (temperature, max_tokens, stop, ...) are accepted and
    ignored: the agent answers greedily with its own stop tags. Agent settings ride along as extra fields
    (`extra_body` in the openai client): max_turns, top_k, mode."""

    model_config = ConfigDict(extra="ignore")

    model: str = Field(min_length=1, max_length=128, description="A policy version, or 'bridge' for the active one.")
    messages: list[ChatMessage] = Field(min_length=1, max_length=256)
    stream: bool = False
    stream_options: StreamOptions | None = None
    n: int = Field(1, ge=1, le=1, description="One answer per request.")
    max_turns: int = Field(4, ge=0, le=MAX_TURNS, description="Agent: searches allowed before the final answer.")
    top_k: int = Field(DEFAULT_TOP_K, ge=1, le=MAX_AGENT_TOP_K, description="Agent: documents per search.")
    mode: QuestionMode = Field("agent", description="agent, naive-rag or direct (as on /v1/agent/query).")

    @model_validator(mode="after")
    def _has_question(self) -> ChatCompletionRequest:
        users = [m for m in self.messages if m.role == "user"]
        if not users or not users[-1].text.strip():
            raise ValueError("the last user message is the question: send one with text")
        if len(users[-1].text) > MAX_QUESTION_CHARS:
            raise ValueError(f"the question (last user message) must be at most {MAX_QUESTION_CHARS} characters")
        return self

    @property
    def question(self) -> str:
        return next(m for m in reversed(self.messages) if m.role == "user").text.strip()

    def to_agent_query(self) -> AgentQueryRequest:
        return AgentQueryRequest(question=self.question, max_turns=self.max_turns, top_k=self.top_k, mode=self.mode)


class BridgeDoc(BaseModel):
    id: str
    title: str
    score: float | None = None


class BridgeSearch(BaseModel):
    turn: int
    query: str
    docs: list[BridgeDoc]
    mode: str
    logprob: float | None = None
    retriever_version: str


class BridgeExtension(BaseModel):
    """What the agent did to reach the answer: the `bridge` field of a completion (and of its last chunk)."""

    trajectory_id: str
    policy_version: str
    retriever_version: str
    reasoning: str = Field(description="Everything the policy generated, turn after turn (think, search, answer).")
    turns: list[str] = Field(description="The generated text of each turn.")
    searches: list[BridgeSearch]
    timings: dict[str, float] = Field(default_factory=dict)


class AssistantMessage(BaseModel):
    role: Literal["assistant"] = "assistant"
    content: str


class ChatChoice(BaseModel):
    index: int = 0
    message: AssistantMessage
    finish_reason: Literal["stop", "length"] = "stop"
    logprobs: None = None


class Usage(BaseModel):
    prompt_tokens: int
    completion_tokens: int = Field(description="Tokens the policy generated (retrieved passages not counted).")
    total_tokens: int


class ChatCompletionResponse(BaseModel):
    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int
    model: str
    choices: list[ChatChoice]
    usage: Usage
    bridge: BridgeExtension


class ChunkDelta(BaseModel):
    role: Literal["assistant"] | None = None
    content: str | None = None
    reasoning_content: str | None = None


class ChunkChoice(BaseModel):
    index: int = 0
    delta: ChunkDelta
    finish_reason: Literal["stop", "length"] | None = None
    logprobs: None = None


class ChatCompletionChunk(BaseModel):
    id: str
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    created: int
    model: str
    choices: list[ChunkChoice]
    usage: Usage | None = None
    bridge: dict[str, Any] | None = Field(
        None,
        description="A search or its documents as they happen ({'event': ...}); on the last chunk, the whole "
        "BridgeExtension.",
    )


class ModelCard(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int
    owned_by: str = "bridge"
    parent: str | None = None


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]
