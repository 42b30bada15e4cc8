"""Typed HTTP clients (sync and async) for the retriever service, used by the policy, trainer and tests."""

from __future__ import annotations

from typing import Any

import httpx
from tenacity import retry, retry_if_exception_type, stop_after_attempt, wait_random_exponential

from services.common.checkpoints import Manifest
from services.common.schemas.checkpoints import ActivationResponse, CheckpointList
from services.common.schemas.retriever import (
    Document,
    SearchRequest,
    SearchResponse,
    UpsertDocumentsRequest,
    UpsertDocumentsResponse,
)

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


def _headers(admin_token: str | None) -> dict[str, str]:
    return {"Authorization": f"Bearer {admin_token}"} if admin_token else {}


class RetrieverClient:
    def __init__(self, base_url: str, admin_token: str | None = None, timeout: float = 60.0) -> None:
        self._http = httpx.Client(base_url=base_url, timeout=timeout, headers=_headers(admin_token))

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> RetrieverClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @_transient
    def _call(self, method: str, url: str, **kwargs: Any) -> Any:
        response = self._http.request(method, url, **kwargs)
        _raise_for(response)
        return response.json()

    def search(self, queries: list[str], **params: Any) -> SearchResponse:
        body = SearchRequest(queries=queries, **params).model_dump()
        return SearchResponse.model_validate(self._call("POST", "/v1/search", json=body))

    def upsert(self, documents: list[Document]) -> UpsertDocumentsResponse:
        body = UpsertDocumentsRequest(documents=documents).model_dump()
        return UpsertDocumentsResponse.model_validate(self._call("POST", "/v1/documents", json=body))

    def get_document(self, doc_id: str) -> Document:
        return Document.model_validate(self._call("GET", f"/v1/documents/{doc_id}"))

    def delete_document(self, doc_id: str) -> None:
        self._call("DELETE", f"/v1/documents/{doc_id}")

    def checkpoints(self) -> CheckpointList:
        return CheckpointList.model_validate(self._call("GET", "/v1/checkpoints"))

    def register(self, path: str) -> Manifest:
        return Manifest.model_validate(self._call("POST", "/v1/checkpoints", json={"path": path}))

    def activate(self, version: str) -> ActivationResponse:
        return ActivationResponse.model_validate(self._call("POST", f"/v1/checkpoints/{version}/activate"))

    def rollback(self) -> ActivationResponse:
        return ActivationResponse.model_validate(self._call("POST", "/v1/checkpoints/rollback"))

    def ready(self) -> dict:
        return self._call("GET", "/readyz")


class AsyncRetrieverClient:
    def __init__(self, base_url: str, admin_token: str | None = None, timeout: float = 60.0) -> None:
        self._http = httpx.AsyncClient(base_url=base_url, timeout=timeout, headers=_headers(admin_token))

    async def aclose(self) -> None:
        await self._http.aclose()

    async def __aenter__(self) -> AsyncRetrieverClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    @_transient
    async def _call(self, method: str, url: str, **kwargs: Any) -> Any:
        response = await self._http.request(method, url, **kwargs)
        _raise_for(response)
        return response.json()

    async def search(self, queries: list[str], **params: Any) -> SearchResponse:
        body = SearchRequest(queries=queries, **params).model_dump()
        return SearchResponse.model_validate(await self._call("POST", "/v1/search", json=body))

    async def upsert(self, documents: list[Document]) -> UpsertDocumentsResponse:
        body = UpsertDocumentsRequest(documents=documents).model_dump()
        return UpsertDocumentsResponse.model_validate(await self._call("POST", "/v1/documents", json=body))

    async def checkpoints(self) -> CheckpointList:
        return CheckpointList.model_validate(await self._call("GET", "/v1/checkpoints"))

    async def register(self, path: str) -> Manifest:
        return Manifest.model_validate(await self._call("POST", "/v1/checkpoints", json={"path": path}))

    async def activate(self, version: str) -> ActivationResponse:
        return ActivationResponse.model_validate(await self._call("POST", f"/v1/checkpoints/{version}/activate"))
