"""bench.raw_http, the benches' lean load generator, against a real HTTP server (uvicorn on a FastAPI app)."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from types import SimpleNamespace

import pytest
import uvicorn
from fastapi import FastAPI
from fastapi.responses import JSONResponse, StreamingResponse

from bench import retriever
from bench.raw_http import HTTPStatusError, RawConnection
from tests.conftest import free_port


@pytest.fixture(scope="module")
def server():
    app = FastAPI()
    app.state.seen = []

    @app.post("/echo")
    async def echo(body: dict) -> dict:
        app.state.seen.append(body)
        return {"got": body}

    @app.post("/bad")
    async def bad(body: dict) -> JSONResponse:
        return JSONResponse({"detail": "no"}, status_code=422)

    @app.post("/chunked")
    async def chunked(body: dict) -> StreamingResponse:
        return StreamingResponse(iter([b'{"a":', b" 1}"]), media_type="application/json")

    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started and time.monotonic() < deadline:
        time.sleep(0.05)
    yield SimpleNamespace(url=f"http://127.0.0.1:{port}", seen=app.state.seen)
    server.should_exit = True
    thread.join(timeout=10)


def test_many_requests_share_one_keep_alive_connection(server):
    async def go() -> list[dict]:
        async with RawConnection(server.url) as connection:
            bodies = [json.dumps({"i": i, "text": "é" * i}).encode() for i in range(5)]
            return [json.loads(await connection.send(connection.request_bytes("/echo", b))) for b in bodies]

    assert asyncio.run(go()) == [{"got": {"i": i, "text": "é" * i}} for i in range(5)]


def test_a_non_2xx_answer_raises_and_a_chunked_one_is_read_whole(server):
    async def go(path: str) -> bytes:
        async with RawConnection(server.url) as connection:
            return await connection.send(connection.request_bytes(path, b"{}"))

    with pytest.raises(HTTPStatusError, match="422"):
        asyncio.run(go("/bad"))
    assert json.loads(asyncio.run(go("/chunked"))) == {"a": 1}


@pytest.mark.parametrize("client", ["raw", "httpx"])
def test_drive_sends_every_batch_and_accounts_for_the_cpu(server, client):
    batches = [[f"q{i}-{client}"] for i in range(40)]
    r = asyncio.run(retriever.drive(server.url, "/echo", lambda b: {"queries": b}, batches, 4, client=client,
                                    server_pid=None))  # fmt: skip
    sent = [body["queries"][0] for body in server.seen if body.get("queries", [""])[0].endswith(client)]
    assert sorted(sent) == sorted(["q0-" + client] + [b[0] for b in batches])  # the warm-up, then each batch once
    assert r["qps"] > 0 and r["p50_ms"] <= r["p99_ms"]
    assert r["client_cpu_ms_per_query"] > 0  # this process's clients (and here the server thread too)
    assert r["server_cpu_ms_per_query"] != r["server_cpu_ms_per_query"]  # NaN: no server process was named
