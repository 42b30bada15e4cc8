from __future__ import annotations

import time

from fastapi import APIRouter, Response

from services.common.schemas.retriever import RetrieveRequest, SearchRequest, SearchResponse
from services.retriever.routes.deps import Metrics, SearchSlot, Service

router = APIRouter()
ERRORS = {
    400: {"description": "Over this deployment's bound on the work of one request (reason in `detail`)"},
    422: {"description": "Invalid body (reason in `detail`)"},
    413: {"description": "Body too large"},
    409: {"description": "The pinned `version` is not registered here"},
    429: {"description": "As many searches in flight as this deployment allows: retry after Retry-After seconds"},
}


@router.post("/v1/search", response_model=SearchResponse, responses=ERRORS, dependencies=[SearchSlot])
async def search(body: SearchRequest, service: Service, metrics: Metrics) -> Response:
    started = time.perf_counter()
    response = await service.search(body)
    metrics.search_seconds.labels(body.mode).observe(time.perf_counter() - started)
    metrics.queries.inc(len(body.queries))
    # Serialized once, in pydantic's core: returned as a model, FastAPI would dump, re-validate and encode it.
    return Response(response.model_dump_json(), media_type="application/json")


@router.post("/retrieve", responses=ERRORS, dependencies=[SearchSlot])
async def retrieve(body: RetrieveRequest, service: Service) -> dict:
    """Search-R1's retrieval server contract, so its configs can point here unchanged."""
    request = SearchRequest(queries=body.queries, top_k=body.topk, candidates=max(body.topk, 1))
    response = await service.search(request)
    result = []
    for item in response.results:
        docs = [{"id": d.id, "contents": f"{d.title}\n{d.text}"} for d in item.docs]
        if body.return_scores:
            result.append([{"document": doc, "score": d.score} for doc, d in zip(docs, item.docs, strict=True)])
        else:
            result.append(docs)
    return {"result": result}
