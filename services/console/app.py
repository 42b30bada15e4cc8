"""`build_app(settings)`: the web console. One static page (no build step) and a pass-through to the services'
JSON API under /api, so the browser talks to one origin."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI, Request
from fastapi.staticfiles import StaticFiles

from services.common.errors import install_error_handlers
from services.common.http import BodySizeLimit, install_trusted_hosts
from services.console.routes import pages, proxy
from services.console.routes.pages import STATIC
from services.console.service import ConsoleService
from services.console.settings import ConsoleSettings

# The page loads only its own files: no inline script, nothing from elsewhere, and never framed.
SECURITY_HEADERS = {
    "Content-Security-Policy": "default-src 'self'; img-src 'self' data:; style-src 'self' 'unsafe-inline'; "
    "frame-ancestors 'none'",
    "Referrer-Policy": "no-referrer",
    "X-Content-Type-Options": "nosniff",
}


def build_app(settings: ConsoleSettings | None = None) -> FastAPI:
    settings = settings or ConsoleSettings()

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        service = ConsoleService(settings)
        app.state.service = service
        try:
            yield
        finally:
            await service.close()

    app = FastAPI(title="BRIDGE console", version="1", lifespan=lifespan)
    install_error_handlers(app)
    app.add_middleware(BodySizeLimit, max_bytes=2 * 1024 * 1024)
    install_trusted_hosts(app, settings.resolved_trusted_hosts)  # the one a browser reaches: DNS rebinding

    @app.middleware("http")
    async def security_headers(request: Request, call_next):
        response = await call_next(request)
        if not request.url.path.startswith("/api/"):
            response.headers.update(SECURITY_HEADERS)
        return response

    app.include_router(pages.router)
    app.include_router(proxy.router)
    app.mount("/static", StaticFiles(directory=STATIC), name="static")
    return app
