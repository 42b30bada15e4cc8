"""A route's work in flight is bounded: one request more than the bound is a 429 with Retry-After at once, and the
place comes back when a request ends. On a real FastAPI app (anyio's CapacityLimiter under it), and wired into the
retriever's search routes and the policy's rollouts."""

from __future__ import annotations

import asyncio

import httpx
import pytest
from fastapi import Depends, FastAPI

from services.common.errors import install_error_handlers
from services.common.http import InFlightLimit


def test_one_request_over_the_bound_is_a_429_with_retry_after_and_the_place_comes_back():
    limit = InFlightLimit("slow", 1, retry_after_s=2)
    release = asyncio.Event()
    app = FastAPI()
    install_error_handlers(app)

    async def slot():
        async with limit.slot():
            yield

    @app.get("/slow", dependencies=[Depends(slot)])
    async def slow() -> dict:
        await release.wait()
        return {"ok": True}

    async def run() -> None:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
            first = asyncio.create_task(client.get("/slow"))
            while limit.limiter.borrowed_tokens == 0:
                await asyncio.sleep(0.01)
            refused = await client.get("/slow")
            assert refused.status_code == 429 and refused.headers["retry-after"] == "2"
            assert refused.json()["error"]["type"] == "too_busy" and "1 requests in flight" in refused.json()["detail"]
            release.set()
            assert (await first).status_code == 200
            assert limit.limiter.borrowed_tokens == 0
            assert (await client.get("/slow")).status_code == 200

    asyncio.run(run())


@pytest.mark.parametrize(
    ("service", "path", "slot"),
    [("retriever", "/v1/search", "search_slot"), ("retriever", "/retrieve", "search_slot"),
     ("policy", "/v1/agent/rollouts", "rollout_slot")],
)  # fmt: skip
def test_the_services_routes_take_a_place(service, path, slot, tmp_path, monkeypatch):
    """The search routes share the retriever's bound (the one search thread), the rollouts have the policy's."""
    monkeypatch.setenv("BRIDGE_DATA_DIR", str(tmp_path))
    if service == "retriever":
        from services.retriever.app import build_app
        from services.retriever.settings import RetrieverSettings

        app, limit = build_app(RetrieverSettings(max_searches_in_flight=5)), "search_limit"
    else:
        from services.policy.app import build_app
        from services.policy.settings import PolicySettings

        app, limit = build_app(PolicySettings(max_rollouts_in_flight=5)), "rollout_limit"
    [route] = [r for r in app.routes if getattr(r, "path", None) == path]
    assert slot in {d.call.__name__ for d in route.dependant.dependencies}
    assert getattr(app.state, limit).limit == 5
