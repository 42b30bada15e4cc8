"""What every service client shares: retries of transient connection errors, the error type, the sync
client's lifecycle."""

from __future__ import annotations

from typing import Any

import httpx
from tenacity import retry, retry_if_exception_type, stop_after_attempt, wait_random_exponential

# Only a connection that never reached the server is safe to retry blindly.
_transient = retry(
    retry=retry_if_exception_type((httpx.ConnectError, httpx.ConnectTimeout, httpx.RemoteProtocolError)),
    wait=wait_random_exponential(multiplier=0.2, max=5),
    stop=stop_after_attempt(5),
    reraise=True,
)


class ServiceError(Exception):
    def __init__(self, status_code: int, detail: str) -> None:
        super().__init__(f"{status_code}: {detail}")
        self.status_code = status_code
        self.detail = detail


def _raise_for(response: httpx.Response) -> None:
    if response.is_success:
        return
    try:
        detail = response.json().get("detail", response.text)
    except ValueError:
        detail = response.text
    raise ServiceError(response.status_code, str(detail))


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
