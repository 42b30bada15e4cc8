"""The middleware every service installs: requests counted and timed by route, method and status (errors and refusals
too), bodies over the limit refused with 413 before the route reads them."""

from __future__ import annotations

from fastapi import FastAPI
from fastapi.testclient import TestClient
from pydantic import BaseModel

from services.common.http import install_request_middleware
from services.common.metrics import ServiceMetrics


class Body(BaseModel):
    text: str


def samples(app: FastAPI, name: str) -> dict[tuple[str, str, str], float]:
    """(handler, method, status) -> value of the app's samples called `name`."""
    return {(s.labels["handler"], s.labels["method"], s.labels["status"]): s.value
            for family in app.state.metrics.registry.collect() for s in family.samples if s.name == name}  # fmt: skip


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
    assert samples(app, "bridge_test_requests_total") == {
        ("/echo/{name}", "POST", "200"): 2,
        ("/echo/{name}", "POST", "422"): 1,
        ("/echo/{name}", "POST", "413"): 1,  # refused before the route read it, and still counted under it
        ("none", "GET", "404"): 1,  # no route
        ("/boom", "GET", "500"): 1,
    }
    # and timed: one latency observation per request, in the same labels
    assert samples(app, "bridge_test_request_duration_seconds_count") == samples(app, "bridge_test_requests_total")
    assert all(v > 0 for v in samples(app, "bridge_test_request_duration_seconds_sum").values())


def test_a_chunked_body_over_the_limit_is_refused_with_413_not_a_parse_error():
    """No Content-Length to refuse up front: the limit trips while FastAPI reads the body, and the client must still
    get the 413 the docs promise (it got 400 "There was an error parsing the body")."""
    from services.common.errors import install_error_handlers

    app = FastAPI()
    app.state.metrics = ServiceMetrics("test")
    install_request_middleware(app, max_body_bytes=64)
    install_error_handlers(app)

    @app.post("/echo")
    async def echo(body: Body) -> dict:
        return {"text": body.text}

    def chunks(total: int):
        text = b'{"text": "' + b"x" * total + b'"}'
        yield from (text[i : i + 16] for i in range(0, len(text), 16))

    client = TestClient(app, raise_server_exceptions=False)
    assert client.post("/echo", content=chunks(10), headers={"content-type": "application/json"}).status_code == 200
    refused = client.post("/echo", content=chunks(500), headers={"content-type": "application/json"})
    assert refused.status_code == 413, refused.text
    assert refused.json()["error"]["type"] == "payload_too_large" and "exceeds 64 bytes" in refused.json()["detail"]


def test_a_host_outside_the_trusted_list_is_refused():
    app = FastAPI()
    app.state.metrics = ServiceMetrics("test")
    install_request_middleware(app, max_body_bytes=64, trusted_hosts=["127.0.0.1", "*.example.org"])

    @app.get("/ping")
    async def ping() -> dict:
        return {"ok": True}

    client = TestClient(app, base_url="http://127.0.0.1")
    assert client.get("/ping").status_code == 200
    assert client.get("/ping", headers={"host": "api.example.org"}).status_code == 200
    refused = client.get("/ping", headers={"host": "rebound.attacker.test"})
    assert refused.status_code == 400 and "host" in refused.text.lower()


def training_app(loopback_only: bool, keys: tuple[str, ...] = ()) -> TestClient:
    from fastapi import Depends

    from services.common.errors import install_error_handlers
    from services.common.http import require_training_key

    app = FastAPI()
    app.state.metrics = ServiceMetrics("test")
    app.state.api_keys, app.state.admin_token, app.state.loopback_only = keys, "admin-secret", loopback_only
    install_error_handlers(app)

    @app.post("/v1/feedback", dependencies=[Depends(require_training_key)])
    async def feedback() -> dict:
        return {"ok": True}

    return TestClient(app, raise_server_exceptions=False)


def test_feeding_training_beyond_loopback_needs_a_key_or_the_admin_token():
    admin = {"authorization": "Bearer admin-secret"}
    assert training_app(loopback_only=True).post("/v1/feedback").status_code == 200  # only this machine reaches it
    exposed = training_app(loopback_only=False)
    refused = exposed.post("/v1/feedback")
    assert refused.status_code == 401 and "beyond loopback" in refused.json()["detail"]
    assert exposed.post("/v1/feedback", headers={"authorization": "Bearer guess"}).status_code == 403
    assert exposed.post("/v1/feedback", headers=admin).status_code == 200
    keyed = training_app(loopback_only=False, keys=("k1",))
    assert keyed.post("/v1/feedback", headers={"x-api-key": "k1"}).status_code == 200
    assert keyed.post("/v1/feedback").status_code == 401


def test_loopback_is_told_apart_from_every_other_bind_address():
    from services.common.http import is_loopback

    assert all(map(is_loopback, ("127.0.0.1", "127.0.1.1", "::1", "[::1]", "localhost")))
    assert not any(map(is_loopback, ("0.0.0.0", "::", "10.0.0.5", "policy")))
