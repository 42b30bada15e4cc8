"""Wire models of the policy service (DESIGN §3, §7), and the trajectory record the trainer reads."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, StringConstraints, model_validator

from services.common.schemas.retriever import DEFAULT_TOP_K, MAX_AGENT_TOP_K

MAX_QUESTION_CHARS = 2_000
MAX_TURNS = 8
MAX_ROLLOUT_ITEMS = 64
MAX_GROUP_SIZE = 16
MAX_GOLD = 32
MAX_ORACLE_DOCS = 50

Question = Annotated[str, StringConstraints(min_length=1, max_length=MAX_QUESTION_CHARS)]
Gold = Annotated[str, StringConstraints(min_length=1, max_length=500)]


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


# The modes a question alone can ask for; the oracle modes (an evaluation's measurement) also need its passages.
QuestionMode = Literal["agent", "naive-rag", "direct"]
AgentMode = Literal["agent", "naive-rag", "direct", "oracle", "oracle-search"]
ORACLE_MODES: tuple[AgentMode, ...] = ("oracle", "oracle-search")
OracleDocId = Annotated[str, StringConstraints(min_length=1, max_length=256, pattern=r"^[^\s/]+$")]
RewardKind = Literal["em", "f1", "em-format"]


class AgentQueryRequest(Strict):
    question: Question
    max_turns: int = Field(4, ge=0, le=MAX_TURNS, description="Searches allowed before the final answer turn.")
    top_k: int = Field(DEFAULT_TOP_K, ge=1, le=MAX_AGENT_TOP_K)
    mode: AgentMode = Field(
        "agent",
        description="agent: the Search-R1 loop; naive-rag: one retrieval with the question, then the answer "
        "(max_turns ignored); direct: answer with no retrieval (max_turns ignored); oracle: the agent loop with "
        "the passages of `oracle_doc_ids` shown as its first <information> block, written as the scaffold writes "
        "a search with the question, before the policy's first turn; oracle-search: the agent loop whose own first "
        "search is answered with those passages (an oracle retriever, once). Later searches go to the retriever. "
        "The last four are evaluation baselines.",
    )
    oracle_doc_ids: list[OracleDocId] | None = Field(
        None,
        min_length=1,
        max_length=MAX_ORACLE_DOCS,
        description="the oracle modes only (and required there): ids of indexed passages (a question's supporting "
        "documents), shown in this order. Only their titles and texts reach the model; an id the retriever does "
        "not hold is a 400.",
    )
    stream: bool = Field(
        False,
        description="Answer as Server-Sent Events, one event per step as it happens (see AgentEvent), ending with "
        "a `done` event that carries this same response. A client that disconnects cancels its generation.",
    )

    @model_validator(mode="after")
    def _oracle_passages(self) -> AgentQueryRequest:
        if (self.mode in ORACLE_MODES) != (self.oracle_doc_ids is not None):
            raise ValueError("oracle_doc_ids is required in the oracle modes and refused in every other mode")
        if self.oracle_doc_ids is not None and len(set(self.oracle_doc_ids)) != len(self.oracle_doc_ids):
            raise ValueError("oracle_doc_ids must not repeat an id")
        return self


class SearchStepView(BaseModel):
    query: str
    docs: list[dict[str, str]]
    mode: str | None = Field(
        None, description="greedy or sample (the retriever answered), or oracle (the request's own passages)."
    )


class TurnView(BaseModel):
    text: str
    search: SearchStepView | None = None


class AgentQueryResponse(BaseModel):
    answer: str
    trajectory_id: str
    policy_version: str
    retriever_version: str
    turns: list[TurnView]
    timings: dict[str, float]


class RolloutItem(Strict):
    id: Annotated[str, StringConstraints(min_length=1, max_length=256)]
    question: Question
    golden_answers: list[Gold] = Field(min_length=1, max_length=MAX_GOLD)


VersionName = Annotated[str, StringConstraints(min_length=1, max_length=128)]


class RolloutRequest(Strict):
    items: list[RolloutItem] = Field(min_length=1, max_length=MAX_ROLLOUT_ITEMS)
    group_size: int = Field(4, ge=1, le=MAX_GROUP_SIZE)
    temperature: float = Field(1.0, gt=0.0, le=5.0)
    seed: int | None = Field(0, ge=0, le=2**31 - 1)
    max_turns: int = Field(4, ge=0, le=MAX_TURNS)
    top_k: int = Field(DEFAULT_TOP_K, ge=1, le=MAX_AGENT_TOP_K)
    candidates: int = Field(20, ge=1, le=200, description="M for sampled retrieval.")
    retrieval_temperature: float = Field(0.05, gt=0.0, le=100.0)
    run_id: Annotated[str, StringConstraints(max_length=128)] | None = None
    initial_search: bool | None = Field(
        None, description="Retrieve with the question before the first turn; null: the service's setting."
    )
    reward: RewardKind = Field(
        "em",
        description="em: exact match (the paper's); f1: token F1 (ReSearch, R1-Searcher); em-format: Search-R1's "
        "qa_em_format (0.2 for a well-formed trajectory, full credit only for a correct answer).",
    )
    policy_version: VersionName | None = Field(
        None,
        description="Generate with this registered policy version, not the active one (a training run pins the "
        "version it trains from); 409 if it is not registered here.",
    )
    retriever_version: VersionName | None = Field(
        None, description="Search with this registered retriever version; 409 if the retriever does not have it."
    )

    @model_validator(mode="after")
    def _bounded_total(self) -> RolloutRequest:
        if len(self.items) * self.group_size > 256:
            raise ValueError("items x group_size must be at most 256 trajectories per request")
        if self.top_k > self.candidates:
            raise ValueError("top_k must not exceed candidates")
        return self


class RolloutSummary(BaseModel):
    trajectory_id: str
    item_id: str
    answer: str | None
    reward: float
    reward_kind: RewardKind = "em"
    em: float
    f1: float
    policy_version: str
    retriever_version: str


class RolloutResponse(BaseModel):
    trajectories: list[RolloutSummary]


class FeedbackRequest(Strict):
    trajectory_id: Annotated[str, StringConstraints(min_length=1, max_length=64)]
    golden_answers: list[Gold] | None = Field(None, min_length=1, max_length=MAX_GOLD)
    reward: float | None = Field(None, ge=-10.0, le=10.0)
    reward_kind: RewardKind = Field(
        "em", description="How golden_answers score the answer: em, f1 or em-format (as POST /v1/rollouts' reward)."
    )

    @model_validator(mode="after")
    def _one_of(self) -> FeedbackRequest:
        if (self.golden_answers is None) == (self.reward is None):
            raise ValueError("give exactly one of golden_answers or reward")
        if self.reward is not None and self.reward_kind != "em":
            raise ValueError("reward_kind scores golden_answers; a given reward is taken as it is")
        return self


class ServingConfig(BaseModel):
    """How the policy service serves /v1/agent/query: what a live run can learn from its traffic."""

    temperature: float = Field(description="Decoding temperature of served queries (0: greedy).")
    retrieval: Literal["greedy", "sample"]
    retrieval_share: float = Field(description="Share of served queries whose retrieval samples (with 'sample').")
    retrieval_candidates: int
    retrieval_temperature: float

    @property
    def explores_retrieval(self) -> bool:
        return self.retrieval == "sample" and self.retrieval_share > 0


class FeedbackResponse(BaseModel):
    trajectory_id: str
    reward: float
    em: float | None = None
    f1: float | None = None


class SearchStep(BaseModel):
    """One retrieval inside a trajectory: what the retriever policy p_phi saw and did."""

    turn: int
    query: str
    candidates: list[dict[str, float | str]] = Field(description="[{id, score}] over the M candidates")
    chosen_ids: list[str]
    chosen_titles: list[str] = Field(default_factory=list)
    logprob: float | None = Field(None, description="Plackett–Luce log-prob of chosen_ids (sampled mode)")
    mode: str
    temperature: float
    retriever_version: str


class TurnRecord(BaseModel):
    """Generated tokens (policy actions) then the observation tokens appended after them."""

    generated_ids: list[int]
    generated_logprobs: list[float]
    text: str
    finish_reason: str | None = None
    observation_ids: list[int] = Field(default_factory=list, description="<information> tokens: masked out")
    search: SearchStep | None = None


class TrajectoryRecord(BaseModel):
    id: str
    item_id: str | None = None
    run_id: str | None = None
    group_index: int | None = None
    question: str
    golden_answers: list[str] | None = None
    prompt: str
    prompt_ids: list[int]
    turns: list[TurnRecord]
    answer: str | None
    policy_version: str
    retriever_version: str
    reward: float | None = None
    reward_kind: RewardKind | None = Field(None, description="How `reward` was scored (em, f1, em-format).")
    em: float | None = None
    f1: float | None = None
    sampling: dict[str, float | int | None] = Field(default_factory=dict)
    mode: AgentMode = "agent"
    status: Literal["complete", "cancelled"] = Field(
        "complete",
        description="cancelled: the client went away mid-answer (a streamed query); the record holds the whole "
        "turns generated before that, never a half-written one, and no answer",
    )
    created_at: float

    @property
    def token_ids(self) -> list[int]:
        ids = list(self.prompt_ids)
        for turn in self.turns:
            ids += turn.generated_ids + turn.observation_ids
        return ids

    @property
    def generated_mask(self) -> list[int]:
        """1 on policy-generated tokens, 0 on the prompt and on retrieved <information> tokens."""
        mask = [0] * len(self.prompt_ids)
        for turn in self.turns:
            mask += [1] * len(turn.generated_ids) + [0] * len(turn.observation_ids)
        return mask


class TrajectorySummary(BaseModel):
    """One line of `GET /v1/trajectories`: the latest logged trajectories, newest first."""

    id: str
    question: str
    answer: str | None
    mode: AgentMode
    status: str
    run_id: str | None = None
    item_id: str | None = None
    policy_version: str
    retriever_version: str
    reward: float | None = None
    em: float | None = None
    f1: float | None = None
    searches: int
    created_at: float


class TrajectoryList(BaseModel):
    trajectories: list[TrajectorySummary]


class TokenSegment(BaseModel):
    """A run of tokens of one kind: `generated` (the policy's actions, trained on) or `prompt`/`observation`
    (masked out of every loss)."""

    kind: Literal["prompt", "generated", "observation"]
    turn: int | None = None
    tokens: list[str] = Field(description="Each token decoded on its own.")
    logprobs: list[float] | None = Field(None, description="Behaviour log-probs of generated tokens.")


class TrajectoryTokens(BaseModel):
    trajectory_id: str
    segments: list[TokenSegment]
