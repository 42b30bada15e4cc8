"""`/api/{policy|retriever|trainer}/...`: the services' own API, passed through unchanged (status, body, a stream
as it comes), so the page talks to one origin and needs no CORS. Only the services' API paths are passed; the
caller's credentials go with each call and are never kept or logged here."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from typing import Annotated, Literal

import httpx
from fastapi import APIRouter, Path, Request
from fastapi.responses import StreamingResponse
from starlette.background import BackgroundTask

from services.common.errors import InvalidRequest, UpstreamUnavailable
from services.console.routes.deps import Service

router = APIRouter(prefix="/api")
_API_PATH = re.compile(r"v1(/[A-Za-z0-9_.~-]+)*|healthz|readyz|metrics")
PASSED_HEADERS = ("content-type", "cache-control", "www-authenticate", "x-accel-buffering")


@router.api_route(
    "/{upstream}/{path:path}",
    methods=["GET", "POST", "DELETE"],
    responses={400: {"description": "Not one of the services' API paths"},
               502: {"description": "The service could not be reached"}},
)  # fmt: skip
async def proxy(
    upstream: Annotated[Literal["policy", "retriever", "trainer"], Path()],
    path: str,
    request: Request,
    service: Service,
) -> StreamingResponse:
    # The whole decoded path, not the route's `path` parameter: the router's pattern ends in `$`, which also matches
    # before a trailing newline, so "v1/checkpoints%0A" arrived here as "v1/checkpoints". fullmatch, for the same
    # reason.
    raw = request.scope["path"].removeprefix(f"/api/{upstream}/")
    if not _API_PATH.fullmatch(raw) or ".." in raw:
        raise InvalidRequest(f"not a service API path: {raw!r}", param="path")
    body = await request.body()
    try:
        response = await service.forward(upstream, request.method, path, request.url.query.encode(),
                                         dict(request.headers), body)  # fmt: skip
    except httpx.HTTPError as exc:
        raise UpstreamUnavailable(f"{upstream} unreachable at {service.urls[upstream]}: {type(exc).__name__}") from exc

    async def relay() -> AsyncIterator[bytes]:
        try:
            async for chunk in response.aiter_raw():
                yield chunk
        finally:  # also when the browser goes away mid-stream: the service then sees its client leave
            await response.aclose()

    headers = {k: v for k, v in response.headers.items() if k.lower() in PASSED_HEADERS}
    # The background close covers a response whose body was never iterated.
    return StreamingResponse(relay(), status_code=response.status_code, headers=headers,
                             background=BackgroundTask(response.aclose))  # fmt: skip
