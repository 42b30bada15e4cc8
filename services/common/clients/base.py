"""What every service client shares: retries of transient connection errors, the error type, the sync
client's lifecycle."""

from __future__ import annotations

from typing import Any

import httpx
from tenacity import retry, retry_if_exception, stop_after_attempt, wait_random_exponential

# Requests whose repetition changes nothing (RFC 9110 9.2.2); no service honours an idempotency key on a POST.
IDEMPOTENT_METHODS = frozenset({"GET", "HEAD", "OPTIONS", "PUT", "DELETE"})
# POSTs that only read (a search, a passage lookup: the body carries the queries): resending one changes nothing.
# Matched at the end of the request's path, so a service behind a proxy's path prefix (/retriever/v1/search) matches.
READ_ONLY_POSTS = frozenset({"/v1/search", "/v1/documents/lookup", "/retrieve"})
# An upstream that is there but cannot answer right now (a checkpoint swap, a restart behind a proxy).
UNAVAILABLE_STATUSES = frozenset({502, 503, 504})


def _safe_to_resend(exc: BaseException) -> bool:
    """A connection that never reached the server (refused, or no connection in time) is safe to retry for any
    request. A connection dropped before the answer (a stale keep-alive connection, a server that died mid-request)
    may have delivered the request already, so it is resent only when repeating it changes nothing: an idempotent
    method, or a POST that only reads (a search); never another POST, which the server may have taken (a registered
    checkpoint, an activation, a logged trajectory). A stale keep-alive connection the server closed as it was
    reused surfaces as a dropped connection or a reset (`ReadError`)."""
    if isinstance(exc, httpx.ConnectError | httpx.ConnectTimeout):
        return True
    if not isinstance(exc, httpx.RemoteProtocolError | httpx.ReadError):
        return False
    return exc.request.method in IDEMPOTENT_METHODS or (
        exc.request.method == "POST" and _is_read_only_path(exc.request.url.path)
    )


def _is_read_only_path(path: str) -> bool:
    # Each entry starts with "/", so a suffix match falls on a segment boundary (/x/v1/search, never /xv1/search).
    return any(path.endswith(read) for read in READ_ONLY_POSTS)


_transient = retry(
    retry=retry_if_exception(_safe_to_resend),
    wait=wait_random_exponential(multiplier=0.2, max=5),
    stop=stop_after_attempt(5),
    reraise=True,
)


class ServiceError(Exception):
    def __init__(self, status_code: int, detail: str) -> None:
        super().__init__(f"{status_code}: {detail}")
        self.status_code = status_code
        self.detail = detail

    def __reduce__(self):  # pickles (Celery keeps the error of a retried task with its Retry)
        return type(self), (self.status_code, self.detail)


class ServiceUnavailableError(ServiceError):
    """A 502, 503 or 504: the service is there but cannot answer right now; a later retry may succeed."""


def service_error(status_code: int, detail: str) -> ServiceError:
    """The error for a response with this status: `ServiceUnavailableError` for 502/503/504."""
    kind = ServiceUnavailableError if status_code in UNAVAILABLE_STATUSES else ServiceError
    return kind(status_code, detail)


def _raise_for(response: httpx.Response) -> None:
    if response.is_success:
        return
    try:
        detail = response.json().get("detail", response.text)
    except ValueError:
        detail = response.text
    raise service_error(response.status_code, str(detail))


def _headers(admin_token: str | None, api_key: str | None = None) -> dict[str, str]:
    headers = {"Authorization": f"Bearer {admin_token}"} if admin_token else {}
    if api_key:
        headers["X-API-Key"] = api_key
    return headers


class SyncServiceClient:
    """An httpx client with the admin token and/or API key, JSON calls that raise `ServiceError`, and `with`
    support."""

    def __init__(
        self, base_url: str, admin_token: str | None = None, timeout: float = 60.0, api_key: str | None = None
    ) -> None:
        self._http = httpx.Client(base_url=base_url, timeout=timeout, headers=_headers(admin_token, api_key))

    def close(self) -> None:
        self._http.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @_transient
    def _call(self, method: str, url: str, **kwargs: Any) -> Any:
        response = self._http.request(method, url, **kwargs)
        _raise_for(response)
        return response.json()
