from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Path

from services.common.schemas.retriever import (
    DeleteDocumentResponse,
    Document,
    DocumentLookupRequest,
    DocumentLookupResponse,
    UpsertDocumentsRequest,
    UpsertDocumentsResponse,
)
from services.retriever.routes.deps import Admin, Service

router = APIRouter()
DocIdPath = Annotated[str, Path(min_length=1, max_length=256)]


@router.post("/v1/documents", response_model=UpsertDocumentsResponse, dependencies=[Admin])
async def upsert_documents(body: UpsertDocumentsRequest, service: Service) -> UpsertDocumentsResponse:
    return await service.upsert_documents(body.documents)


@router.post("/v1/documents/lookup", response_model=DocumentLookupResponse)
async def lookup_documents(body: DocumentLookupRequest, service: Service) -> DocumentLookupResponse:
    """Many documents in one call (the trainer fetches a round's candidates this way); unknown ids are listed
    under `missing`, not an error."""
    return await service.lookup_documents(body.ids)


@router.get("/v1/documents/{doc_id}", response_model=Document, responses={404: {"description": "Unknown id"}})
async def get_document(doc_id: DocIdPath, service: Service) -> Document:
    return await service.get_document(doc_id)


@router.delete("/v1/documents/{doc_id}", response_model=DeleteDocumentResponse, dependencies=[Admin])
async def delete_document(doc_id: DocIdPath, service: Service) -> DeleteDocumentResponse:
    return await service.delete_document(doc_id)
