"""`build_app(settings)`: the policy service. The engine starts in the lifespan, not at import."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI

from services.common.errors import install_error_handlers
from services.common.http import InFlightLimit, install_request_middleware, is_loopback, liveness
from services.policy.metrics import PolicyMetrics
from services.policy.routes import agent, checkpoints, health, openai
from services.policy.service import PolicyService, build_engine
from services.policy.settings import PolicySettings

log = logging.getLogger(__name__)


def build_app(settings: PolicySettings | None = None) -> FastAPI:
    settings = settings or PolicySettings()

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        app.state.admin_token = settings.resolve_admin_token()
        service = PolicyService(settings, build_engine(settings), app.state.metrics.count_needed_trimmed)
        try:
            await service.start()
            app.state.service = service
            log.info("policy ready: engine %s, version %s", settings.engine, service.checkpoints.active)
            yield
        finally:
            app.state.service = None
            await service.stop()

    app = FastAPI(title="BRIDGE policy", version="1", lifespan=lifespan)
    app.state.service = None
    app.state.metrics = PolicyMetrics()
    app.state.rollout_limit = InFlightLimit("rollouts", settings.max_rollouts_in_flight)
    # Set here, not in the lifespan, so no request can ever see the keys unset (and the endpoints open).
    app.state.api_keys = settings.resolved_api_keys
    app.state.loopback_only = is_loopback(settings.host)
    if app.state.api_keys:
        log.info("agent endpoints need an API key (%d configured)", len(app.state.api_keys))
    install_error_handlers(app, openai_paths=openai.OPENAI_PATHS)
    install_request_middleware(app, settings.max_body_bytes, settings.resolved_trusted_hosts)

    for router in (agent.router, openai.router, checkpoints.router, health.router, liveness):
        app.include_router(router)
    return app
