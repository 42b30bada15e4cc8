"""OpenAI-compatible routes: the agent behind `POST /v1/chat/completions` and `GET /v1/models`, so the official
`openai` client (and tools built on it) can ask it. Auth as on the agent routes, with the API key also taken as
`Authorization: Bearer <key>` (how those clients send it); errors in OpenAI's shape `{"error": {...}}`."""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator
from contextlib import aclosing

from fastapi import APIRouter, Depends
from fastapi.responses import StreamingResponse

from services.common.errors import BridgeError, openai_error_body
from services.common.http import require_bearer_api_key
from services.common.schemas.openai import ChatCompletionRequest, ChatCompletionResponse, ModelList
from services.policy import openai_compat
from services.policy.routes.agent import SSE_HEADERS
from services.policy.routes.deps import Metrics, Service

log = logging.getLogger(__name__)
OPENAI_PATHS = ("/v1/chat/", "/v1/models")
ERRORS = {
    400: {"description": "Invalid body or over this deployment's bounds: `{'error': {message, type, param, code}}`"},
    401: {"description": "API keys are on and none was sent (`Authorization: Bearer <key>` or `X-API-Key`)"},
    403: {"description": "The API key (or admin token) is not valid"},
    404: {"description": "`model` is not a registered policy version (code `model_not_found`)"},
    502: {"description": "The LLM engine or the retriever failed"},
}
STREAM_RESPONSE = {
    "description": 'With `"stream": true`: `data: <chat.completion.chunk>` Server-Sent Events, then `data: [DONE]`; '
    "a failure after the stream began is a last `data: {'error': {...}}`.",
    "content": {"text/event-stream": {"schema": {"type": "string"}}},
}
router = APIRouter(dependencies=[Depends(require_bearer_api_key)], responses=ERRORS)


async def _sse(chunks: AsyncIterator, metrics) -> AsyncIterator[str]:
    async with aclosing(chunks):
        try:
            async for chunk in chunks:
                yield f"data: {chunk.model_dump_json(exclude_none=True)}\n\n"
        except Exception as exc:
            if isinstance(exc, BridgeError):
                body = openai_error_body(exc.status_code, exc.message, exc.param, exc.code)
            else:
                log.exception("streamed chat completion failed")
                body = openai_error_body(500, "the agent failed; see the policy service log")
            yield f"data: {json.dumps(body)}\n\n"
            return
    metrics.trajectories.labels("query").inc()
    yield "data: [DONE]\n\n"


@router.post("/v1/chat/completions", response_model=ChatCompletionResponse, responses={200: STREAM_RESPONSE})
async def chat_completions(body: ChatCompletionRequest, service: Service, metrics: Metrics):
    if body.stream:
        version = openai_compat.pinned_version(body)
        if version is not None:
            service.checkpoints.check_registered(version)  # an unknown model is a 404, before the stream's 200
        return StreamingResponse(_sse(openai_compat.complete_stream(service, body), metrics),
                                 media_type="text/event-stream", headers=SSE_HEADERS)  # fmt: skip
    response = await openai_compat.complete(service, body)
    metrics.trajectories.labels("query").inc()
    return response


@router.get("/v1/models", response_model=ModelList)
async def list_models(service: Service) -> ModelList:
    return openai_compat.list_models(service)
