"""Pieces every FastAPI service uses: a body-size limit, bearer-token admin auth and optional API keys, the service
object its lifespan builds, and `/healthz`."""

from __future__ import annotations

import hmac
import ipaddress
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from typing import Any

from fastapi import APIRouter, FastAPI, Request
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.middleware.trustedhost import TrustedHostMiddleware
from starlette.types import ASGIApp, Receive, Scope, Send

from services.common.errors import Forbidden, NotReady, TooBusy, Unauthorized, error_body


class BodySizeLimit:
    """Refuses bodies over `max_bytes` with 413 before they are read into memory (chunked bodies too)."""

    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = dict(scope.get("headers") or []).get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.max_bytes:
            await self._refuse(send)
            return
        received = 0

        async def limited_receive():
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.max_bytes:
                    raise _TooLarge(self.max_bytes)
            return message

        try:
            await self.app(scope, limited_receive, send)
        except _TooLarge:
            await self._refuse(send)

    async def _refuse(self, send: Send) -> None:
        import json

        body = json.dumps(error_body(413, "payload_too_large", f"request body exceeds {self.max_bytes} bytes")).encode()
        await send(
            {
                "type": "http.response.start",
                "status": 413,
                "headers": [
                    (b"content-type", b"application/json"),
                    (b"content-length", str(len(body)).encode()),
                ],
            }
        )
        await send({"type": "http.response.body", "body": body})


class _TooLarge(StarletteHTTPException):
    """Raised from `receive` when a chunked body passes the limit. An HTTPException because FastAPI re-raises those
    from its body parsing (any other exception there becomes a 400 "error parsing the body"), so the app's handler
    answers the 413; where no route parses the body, `BodySizeLimit` answers it."""

    def __init__(self, max_bytes: int) -> None:
        super().__init__(413, f"request body exceeds {max_bytes} bytes")


def check_bearer(request: Request, expected: str) -> None:
    """Constant-time bearer check: 401 without credentials, 403 with wrong ones."""
    header = request.headers.get("authorization", "")
    scheme, _, token = header.partition(" ")
    if scheme.lower() != "bearer" or not token:
        raise Unauthorized("admin endpoint: send 'Authorization: Bearer <BRIDGE_ADMIN_TOKEN>'")
    if not hmac.compare_digest(token.strip().encode(), expected.encode()):
        raise Forbidden("admin token is not valid")


# The dependencies here are `async def` though they never await: FastAPI runs a plain `def` dependency in its thread
# pool, a thread hop a request for a few attribute reads (about 10 % of the retriever's request path, profiled).
async def require_admin(request: Request) -> None:
    """FastAPI dependency: the app keeps its token in `app.state.admin_token`."""
    check_bearer(request, request.app.state.admin_token)


API_KEY_HEADER = "x-api-key"


def _matches_any(supplied: str, keys: Sequence[str]) -> bool:
    # Compare against every key, without stopping at the first match, so the time taken does not say which
    # key (or how many) matched.
    found = False
    for key in keys:
        found |= hmac.compare_digest(supplied.encode(), key.encode())
    return found


def check_api_key(request: Request, keys: Sequence[str], admin_token: str | None) -> None:
    """`X-API-Key` must be one of `keys` (no check when `keys` is empty). The admin bearer token is accepted
    too, so the trainer and operators need one secret only. 401 without credentials, 403 with wrong ones."""
    if not keys:
        return
    supplied = request.headers.get(API_KEY_HEADER)
    if supplied is not None:
        if not _matches_any(supplied.strip(), keys):
            raise Forbidden("API key is not valid", code="invalid_api_key")
        return
    if admin_token and request.headers.get("authorization"):
        check_bearer(request, admin_token)
        return
    raise Unauthorized("this endpoint needs an API key: send 'X-API-Key: <key>'", code="missing_api_key")


def check_bearer_api_key(request: Request, keys: Sequence[str], admin_token: str | None) -> None:
    """As `check_api_key`, and an API key may come as `Authorization: Bearer <key>` too: that is how OpenAI's
    clients send theirs (the admin token is still accepted there)."""
    if not keys:
        return
    scheme, _, token = request.headers.get("authorization", "").partition(" ")
    token = token.strip()
    if request.headers.get(API_KEY_HEADER) is None and scheme.lower() == "bearer" and token:
        admin = bool(admin_token) and hmac.compare_digest(token.encode(), admin_token.encode())
        if not (_matches_any(token, keys) | admin):
            raise Forbidden("API key is not valid", code="invalid_api_key")
        return
    check_api_key(request, keys, admin_token)


async def require_bearer_api_key(request: Request) -> None:
    """FastAPI dependency of the OpenAI-compatible routes (see `check_bearer_api_key`)."""
    state = request.app.state
    check_bearer_api_key(request, getattr(state, "api_keys", ()), getattr(state, "admin_token", None))


def is_loopback(host: str) -> bool:
    """Whether a bind address reaches this machine only (127.0.0.0/8, ::1, localhost)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


async def require_training_key(request: Request) -> None:
    """FastAPI dependency of the routes that feed training (feedback, rollouts). With API keys configured, as
    `require_api_key`. With none, open only while the service binds loopback (`app.state.loopback_only`): then
    every caller already runs on this machine. Bound beyond it, keyless, only the admin token may feed training:
    anyone who reaches the port could otherwise steer the next round."""
    state = request.app.state
    keys, admin_token = getattr(state, "api_keys", ()), getattr(state, "admin_token", None)
    if keys:
        check_api_key(request, keys, admin_token)
    elif not getattr(state, "loopback_only", True):
        if not request.headers.get("authorization"):
            raise Unauthorized(
                "this service binds beyond loopback and has no API keys: feeding training needs one "
                "(BRIDGE_POLICY_API_KEYS) or the admin token",
                code="missing_api_key",
            )
        check_bearer(request, admin_token or "")


async def require_api_key(request: Request) -> None:
    """FastAPI dependency: keys in `app.state.api_keys` (empty: open), admin token in `app.state.admin_token`."""
    check_api_key(request, getattr(request.app.state, "api_keys", ()), getattr(request.app.state, "admin_token", None))


def install_trusted_hosts(app: FastAPI, trusted_hosts: Sequence[str]) -> None:
    """A 400 for any Host header outside `trusted_hosts` (Starlette's `TrustedHostMiddleware`); none for '*'."""
    if "*" not in trusted_hosts:
        app.add_middleware(TrustedHostMiddleware, allowed_hosts=list(trusted_hosts))


def install_request_middleware(app: FastAPI, max_body_bytes: int, trusted_hosts: Sequence[str] = ("*",)) -> None:
    """Body-size limit, the Host header checked against `trusted_hosts` (Starlette's `TrustedHostMiddleware`: 400
    for any other), and requests counted and timed by route, method and status in `app.state.metrics`
    (`ServiceMetrics.instrument`)."""
    app.add_middleware(BodySizeLimit, max_bytes=max_body_bytes)
    install_trusted_hosts(app, trusted_hosts)
    app.state.metrics.instrument(app)  # added last: outermost, so it counts the 413s too


def app_service(request: Request, loading: str) -> Any:
    """The service object the app's lifespan put on `app.state`; 503 (`loading` says why) until it has."""
    service = getattr(request.app.state, "service", None)
    if service is None:
        raise NotReady(loading)
    return service


async def app_metrics(request: Request) -> Any:
    return request.app.state.metrics


liveness = APIRouter()


@liveness.get("/healthz")
async def healthz() -> dict:
    """The process answers; `/readyz` says whether its dependencies do."""
    return {"status": "ok"}


class InFlightLimit:
    """At most `limit` requests of one route in the service at once (anyio's CapacityLimiter); one more is a 429
    with Retry-After, at once, instead of a place in a queue whose wait grows with whoever sent the most. Held on
    behalf of a token, not a task: FastAPI may leave a dependency in another task than it entered."""

    def __init__(self, route: str, limit: int, retry_after_s: int = 1) -> None:
        self.route = route
        self.limit = limit
        self.retry_after_s = retry_after_s
        self._limiter: Any = None  # made in the event loop that serves (anyio needs one running)

    @property
    def limiter(self) -> Any:
        import anyio

        if self._limiter is None:
            self._limiter = anyio.CapacityLimiter(self.limit)
        return self._limiter

    @asynccontextmanager
    async def slot(self) -> AsyncIterator[None]:
        import anyio

        token = object()
        try:
            self.limiter.acquire_on_behalf_of_nowait(token)
        except anyio.WouldBlock:
            message = (f"{self.route}: {int(self.limiter.total_tokens)} requests in flight already, this deployment's "
                       f"bound; retry in {self.retry_after_s} s")  # fmt: skip
            raise TooBusy(message, retry_after_s=self.retry_after_s) from None
        try:
            yield
        finally:
            self.limiter.release_on_behalf_of(token)
