"""Typed HTTP clients (sync and async) for the retriever service, used by the policy, trainer and tests."""

from __future__ import annotations

from typing import Any

import httpx

from services.common.clients.base import ServiceError, SyncServiceClient, _headers, _raise_for, _transient
from services.common.schemas.checkpoints import ActivationResponse, CheckpointList, RegisteredCheckpoint
from services.common.schemas.retriever import (
    Document,
    DocumentLookupRequest,
    DocumentLookupResponse,
    SearchRequest,
    SearchResponse,
    UpsertDocumentsRequest,
    UpsertDocumentsResponse,
)

# ServiceError is re-exported: callers catch it from here.
__all__ = ["AsyncRetrieverClient", "RetrieverClient", "ServiceError"]


class RetrieverClient(SyncServiceClient):
    def search(self, queries: list[str], **params: Any) -> SearchResponse:
        body = SearchRequest(queries=queries, **params).model_dump()
        return SearchResponse.model_validate(self._call("POST", "/v1/search", json=body))

    def upsert(self, documents: list[Document]) -> UpsertDocumentsResponse:
        body = UpsertDocumentsRequest(documents=documents).model_dump()
        return UpsertDocumentsResponse.model_validate(self._call("POST", "/v1/documents", json=body))

    def get_document(self, doc_id: str) -> Document:
        return Document.model_validate(self._call("GET", f"/v1/documents/{doc_id}"))

    def get_documents(self, ids: list[str], chunk: int = 1024) -> dict[str, Document]:
        """id -> document for every id, in bounded calls; an unknown id is an error here (the caller asked)."""
        out: dict[str, Document] = {}
        missing: list[str] = []
        for start in range(0, len(ids), chunk):
            body = self._call("POST", "/v1/documents/lookup", json={"ids": ids[start : start + chunk]})
            out.update({d["id"]: Document.model_validate(d) for d in body["documents"]})
            missing += body["missing"]
        if missing:
            raise KeyError(f"{len(missing)} documents not in the retriever, e.g. {missing[:3]}")
        return out

    def delete_document(self, doc_id: str) -> None:
        self._call("DELETE", f"/v1/documents/{doc_id}")

    def checkpoints(self) -> CheckpointList:
        return CheckpointList.model_validate(self._call("GET", "/v1/checkpoints"))

    def register(self, path: str, strict_lineage: bool = False) -> RegisteredCheckpoint:
        body = {"path": path, **({"strict_lineage": True} if strict_lineage else {})}  # older services know only path
        return RegisteredCheckpoint.model_validate(self._call("POST", "/v1/checkpoints", json=body))

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

    async def lookup(self, ids: list[str]) -> DocumentLookupResponse:
        """The stored passages of `ids` (at most 1,024), and the ids the retriever does not hold."""
        body = DocumentLookupRequest(ids=ids).model_dump()
        return DocumentLookupResponse.model_validate(await self._call("POST", "/v1/documents/lookup", json=body))

    async def checkpoints(self) -> CheckpointList:
        return CheckpointList.model_validate(await self._call("GET", "/v1/checkpoints"))

    async def register(self, path: str, strict_lineage: bool = False) -> RegisteredCheckpoint:
        body = {"path": path, **({"strict_lineage": True} if strict_lineage else {})}  # older services know only path
        return RegisteredCheckpoint.model_validate(await self._call("POST", "/v1/checkpoints", json=body))

    async def activate(self, version: str) -> ActivationResponse:
        return ActivationResponse.model_validate(await self._call("POST", f"/v1/checkpoints/{version}/activate"))
