"""The middleware every service installs: requests counted by route and status (errors and refusals too), bodies
over the limit refused with 413 before the route reads them."""

from __future__ import annotations

from fastapi import FastAPI
from fastapi.testclient import TestClient
from pydantic import BaseModel

from services.common.http import install_request_middleware
from services.common.metrics import ServiceMetrics


class Body(BaseModel):
    text: str


def counted(app: FastAPI) -> dict[tuple[str, str], float]:
    samples = app.state.metrics.requests.collect()[0].samples
    return {(s.labels["route"], s.labels["status"]): s.value for s in samples if s.name.endswith("_total")}


def test_requests_are_counted_by_route_and_status_and_big_bodies_refused():
    app = FastAPI()
    app.state.metrics = ServiceMetrics("test")
    install_request_middleware(app, max_body_bytes=64)

    @app.post("/echo/{name}")
    async def echo(name: str, body: Body) -> dict:
        return {"name": name, "text": body.text}

    @app.get("/boom")
    async def boom() -> dict:
        raise RuntimeError("unexpected")

    client = TestClient(app, raise_server_exceptions=False)
    assert client.post("/echo/a", json={"text": "hi"}).json() == {"name": "a", "text": "hi"}
    assert client.post("/echo/b", json={"text": "hi"}).status_code == 200
    assert client.post("/echo/a", json={"wrong": 1}).status_code == 422
    assert client.post("/echo/a", json={"text": "x" * 100}).status_code == 413
    assert client.get("/nowhere").status_code == 404
    assert client.get("/boom").status_code == 500
    assert counted(app) == {
        ("/echo/{name}", "200"): 2,
        ("/echo/{name}", "422"): 1,
        ("other", "413"): 1,  # refused before routing
        ("other", "404"): 1,
        ("/boom", "500"): 1,
    }
