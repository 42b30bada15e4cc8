"""Wire models of the retriever service (DESIGN §7). Every request refuses unknown fields and is bounded."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, StringConstraints, model_validator

MAX_QUERIES = 256
MAX_QUERY_CHARS = 2_000
# Passages per search: 3 by default wherever a search is made (serving, rollouts, runs, the warm start, evaluation:
# the k of recall@k), at most 10 where the agent reads them (its context), at most MAX_TOP_K from /v1/search.
DEFAULT_TOP_K = 3
MAX_AGENT_TOP_K = 10
MAX_TOP_K = 50
MAX_CANDIDATES = 200
MAX_DOCUMENTS = 1_024
MAX_DOC_CHARS = 20_000

QueryText = Annotated[str, StringConstraints(min_length=1, max_length=MAX_QUERY_CHARS)]
DocId = Annotated[str, StringConstraints(min_length=1, max_length=256, pattern=r"^[^\s/]+$")]


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class SearchRequest(Strict):
    queries: list[QueryText] = Field(min_length=1, max_length=MAX_QUERIES)
    top_k: int = Field(DEFAULT_TOP_K, ge=1, le=MAX_TOP_K)
    mode: Literal["greedy", "sample"] = "greedy"
    candidates: int = Field(20, ge=1, le=MAX_CANDIDATES, description="M: how many candidates p_phi covers.")
    temperature: float = Field(1.0, gt=0.0, le=100.0, description="Softmax temperature over candidate scores.")
    seed: int | None = Field(None, ge=0, le=2**63 - 1)
    exact: bool = Field(
        False,
        description="Brute force over every document vector instead of the ANN (HNSW) index: the same vectors, "
        "so the difference measures the index's loss. Costs a full scan a query; for evaluation, not serving.",
    )
    version: Annotated[str, StringConstraints(min_length=1, max_length=128)] | None = Field(
        None,
        description="Search with this registered query-tower version instead of the active one (a training run's "
        "rollouts pin the version they train from); 409 if it is not registered here.",
    )

    @model_validator(mode="after")
    def _top_k_within_candidates(self) -> SearchRequest:
        if self.top_k > self.candidates:
            raise ValueError(f"top_k ({self.top_k}) must not exceed candidates ({self.candidates})")
        return self


class ScoredDoc(BaseModel):
    id: str
    title: str
    text: str
    score: float


class Candidate(BaseModel):
    id: str
    score: float


class SearchResult(BaseModel):
    query: str
    docs: list[ScoredDoc]
    candidates: list[Candidate]
    logprob: float | None = Field(
        None, description="Plackett–Luce log-prob of the shown docs in order (sample mode only)."
    )


class SearchResponse(BaseModel):
    retriever_version: str
    results: list[SearchResult]


class Document(Strict):
    id: DocId
    title: Annotated[str, StringConstraints(max_length=1_000)] = ""
    text: Annotated[str, StringConstraints(min_length=1, max_length=MAX_DOC_CHARS)]


class UpsertDocumentsRequest(Strict):
    documents: list[Document] = Field(min_length=1, max_length=MAX_DOCUMENTS)


DocId = Annotated[str, StringConstraints(min_length=1, max_length=256)]


class DocumentLookupRequest(Strict):
    ids: list[DocId] = Field(min_length=1, max_length=MAX_DOCUMENTS, description="At most 1,024 ids a call.")


class DocumentLookupResponse(BaseModel):
    documents: list[Document] = Field(description="The known ids, in request order (duplicates once).")
    missing: list[str] = Field(description="Requested ids this collection does not hold.")


class UpsertDocumentsResponse(BaseModel):
    upserted: int
    unchanged: int = 0
    replicas_behind: list[str] = Field(
        default_factory=list, description="Replicas of the group that had not applied the write when answered."
    )


class DeleteDocumentResponse(BaseModel):
    deleted: str
    replicas_behind: list[str] = Field(
        default_factory=list, description="Replicas of the group that had not applied the delete when answered."
    )


class RetrieveRequest(Strict):
    """Search-R1's retrieval-server body."""

    queries: list[QueryText] = Field(min_length=1, max_length=MAX_QUERIES)
    topk: int = Field(DEFAULT_TOP_K, ge=1, le=MAX_TOP_K)
    return_scores: bool = False
