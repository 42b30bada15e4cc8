"""`build_app(settings)`: the retriever service. Models and the index load in the lifespan, not at import."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI

from services.common.errors import install_error_handlers
from services.common.http import InFlightLimit, install_request_middleware, liveness
from services.retriever.metrics import RetrieverMetrics
from services.retriever.routes import checkpoints, documents, health, search
from services.retriever.service import RetrieverService
from services.retriever.settings import RetrieverSettings

log = logging.getLogger(__name__)


def build_app(settings: RetrieverSettings | None = None) -> FastAPI:
    settings = settings or RetrieverSettings()

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        app.state.admin_token = settings.resolve_admin_token()
        service = await asyncio.to_thread(RetrieverService, settings, None, app.state.metrics.batch_queries.observe)
        await service.start()
        app.state.service = service
        log.info("retriever ready: version %s, %d documents", service.active.version, service.document_count())
        try:
            yield
        finally:
            app.state.service = None
            await service.stop()

    app = FastAPI(title="BRIDGE retriever", version="1", lifespan=lifespan)
    app.state.service = None
    app.state.metrics = RetrieverMetrics()
    app.state.search_limit = InFlightLimit("search", settings.max_searches_in_flight)
    install_error_handlers(app)
    install_request_middleware(app, settings.max_body_bytes, settings.resolved_trusted_hosts)

    for router in (search.router, documents.router, checkpoints.router, health.router, liveness):
        app.include_router(router)
    return app
