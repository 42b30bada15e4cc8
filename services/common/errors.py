"""Domain exceptions and the one error envelope every service answers with.

Service code raises these; `install_error_handlers` maps them to status codes. Anything else is a bug (500).
The body carries DESIGN §7's `{"detail": reason}` and STYLE's `{"error": {type, message, param, code}}`.
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException


class BridgeError(Exception):
    status_code = 400
    type = "invalid_request"

    def __init__(self, message: str, *, param: str | None = None, code: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.param = param
        self.code = code


class InvalidRequest(BridgeError):
    status_code = 400
    type = "invalid_request"


class Unauthorized(BridgeError):
    status_code = 401
    type = "unauthorized"


class Forbidden(BridgeError):
    status_code = 403
    type = "forbidden"


class NotFound(BridgeError):
    status_code = 404
    type = "not_found"


class Conflict(BridgeError):
    status_code = 409
    type = "conflict"


class PayloadTooLarge(BridgeError):
    status_code = 413
    type = "payload_too_large"


class TooBusy(BridgeError):
    """The route already has as much work in flight as this deployment allows: retry after `retry_after_s`."""

    status_code = 429
    type = "too_busy"

    def __init__(self, message: str, *, retry_after_s: int = 1, code: str | None = "too_busy") -> None:
        super().__init__(message, code=code)
        self.retry_after_s = retry_after_s


class NotReady(BridgeError):
    status_code = 503
    type = "not_ready"


class DependencyUnavailable(BridgeError):
    """A store the service needs (Redis) is down: retry later; nothing was half-done on the caller's behalf."""

    status_code = 503
    type = "dependency_unavailable"


class UpstreamUnavailable(BridgeError):
    status_code = 502
    type = "upstream_unavailable"


class DeadlineExceeded(BridgeError):
    """The whole request ran past its deadline (every turn and search together); nothing of it was stored."""

    status_code = 504
    type = "deadline_exceeded"


def error_body(status: int, type_: str, message: str, param: str | None = None, code: str | None = None) -> dict:
    return {
        "detail": message,
        "error": {"type": type_, "message": message, "param": param, "code": code or str(status)},
    }


# OpenAI's error types by status (what its clients expect under "error"); the routes that speak OpenAI's API
# answer {"error": {message, type, param, code}} and nothing else, and 400 (not 422) for a malformed body.
_OPENAI_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
                 404: "invalid_request_error", 409: "invalid_request_error", 413: "invalid_request_error",
                 422: "invalid_request_error", 429: "rate_limit_error"}  # fmt: skip


def openai_error_body(status: int, message: str, param: str | None = None, code: str | None = None) -> dict:
    type_ = _OPENAI_TYPES.get(status, "server_error" if status >= 500 else "invalid_request_error")
    return {"error": {"message": message, "type": type_, "param": param, "code": code}}


def _describe_validation(errors: list[dict[str, Any]]) -> tuple[str, str | None]:
    parts = []
    for err in errors[:5]:
        loc = ".".join(str(p) for p in err.get("loc", ()) if p != "body")
        parts.append(f"{loc or 'body'}: {err.get('msg', 'invalid')}")
    first = errors[0].get("loc", ()) if errors else ()
    param = ".".join(str(p) for p in first if p != "body") or None
    return "; ".join(parts) or "invalid request body", param


def install_error_handlers(app: FastAPI, openai_paths: tuple[str, ...] = ()) -> None:
    """`openai_paths`: path prefixes that answer errors in OpenAI's shape instead (see `openai_error_body`)."""

    def openai(request: Request) -> bool:
        return request.url.path.startswith(openai_paths) if openai_paths else False

    @app.exception_handler(BridgeError)
    async def _bridge_error(request: Request, exc: BridgeError) -> JSONResponse:
        if openai(request):
            body = openai_error_body(exc.status_code, exc.message, exc.param, exc.code)
        else:
            body = error_body(exc.status_code, exc.type, exc.message, exc.param, exc.code)
        headers = {"WWW-Authenticate": "Bearer"} if exc.status_code == 401 else None
        if isinstance(exc, TooBusy):
            headers = {"Retry-After": str(exc.retry_after_s)}
        return JSONResponse(body, status_code=exc.status_code, headers=headers)

    @app.exception_handler(RequestValidationError)
    async def _validation_error(request: Request, exc: RequestValidationError) -> JSONResponse:
        message, param = _describe_validation(list(exc.errors()))
        if openai(request):
            return JSONResponse(openai_error_body(400, message, param), status_code=400)
        return JSONResponse(error_body(422, "invalid_request", message, param), status_code=422)

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        message = exc.detail if isinstance(exc.detail, str) else str(exc.detail)
        if openai(request):
            return JSONResponse(openai_error_body(exc.status_code, message), status_code=exc.status_code)
        kind = "payload_too_large" if exc.status_code == 413 else "http_error"  # as BodySizeLimit's own 413
        return JSONResponse(error_body(exc.status_code, kind, message), status_code=exc.status_code)
