"""The service clients' retries (services/common/clients/base.py) against a real socket on 127.0.0.1: a request
whose connection drops after the server read it is resent only when repeating it changes nothing (never a POST);
one that never reached the server is retried whatever its method."""

from __future__ import annotations

import asyncio
import socket
import threading
from collections.abc import Iterator

import httpx
import pytest

from services.common.clients.base import SyncServiceClient
from services.common.clients.retriever import AsyncRetrieverClient, RetrieverClient


class DroppingServer:
    """Accepts each connection, reads the request through its body, then closes the socket without answering: the
    server took the request, and the client never hears back. Counts the requests it read."""

    def __init__(self) -> None:
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.requests = 0
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.sock.getsockname()[1]}"

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:  # closed: the test is over
                return
            with conn:
                data = b""
                while b"\r\n\r\n" not in data and (chunk := conn.recv(65536)):
                    data += chunk
                head, _, body = data.partition(b"\r\n\r\n")
                length = next((int(line.split(b":")[1]) for line in head.lower().split(b"\r\n")
                               if line.startswith(b"content-length:")), 0)  # fmt: skip
                while len(body) < length and (chunk := conn.recv(65536)):
                    body += chunk
                if data:
                    self.requests += 1

    def close(self) -> None:
        self.sock.close()


@pytest.fixture
def dropping() -> Iterator[DroppingServer]:
    server = DroppingServer()
    yield server
    server.close()


def test_a_post_the_server_took_is_not_sent_again(dropping):
    with SyncServiceClient(dropping.url, timeout=10) as client:
        with pytest.raises(httpx.RemoteProtocolError):
            client._call("POST", "/v1/checkpoints", json={"path": "/ckpt/v1"})
    assert dropping.requests == 1


def test_a_search_whose_connection_drops_is_sent_again(dropping):
    # A POST that only reads (a stale keep-alive connection to the retriever, closed as the policy reused it).
    with SyncServiceClient(dropping.url, timeout=10) as client:
        with pytest.raises(httpx.RemoteProtocolError):
            client._call("POST", "/v1/search", json={"queries": ["q"]})
    assert dropping.requests == 5  # every attempt of the policy


def test_a_search_behind_a_path_prefix_is_sent_again(dropping):
    # A retriever behind a proxy at /retriever: the request's path is /retriever/v1/search, still a read.
    with SyncServiceClient(dropping.url + "/retriever", timeout=10) as client:
        with pytest.raises(httpx.RemoteProtocolError):
            client._call("POST", "/v1/search", json={"queries": ["q"]})
    assert dropping.requests == 5


def test_a_post_whose_path_only_contains_a_read_is_not_sent_again(dropping):
    with SyncServiceClient(dropping.url, timeout=10) as client:
        with pytest.raises(httpx.RemoteProtocolError):
            client._call("POST", "/v1/search/jobs", json={"queries": ["q"]})
    assert dropping.requests == 1


def test_a_get_whose_connection_drops_is_sent_again(dropping):
    with SyncServiceClient(dropping.url, timeout=10) as client:
        with pytest.raises(httpx.RemoteProtocolError):
            client._call("GET", "/v1/checkpoints")
    assert dropping.requests == 5  # every attempt of the policy


def test_a_post_that_never_reached_the_server_is_retried():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))  # bound, not listening: connections are refused
        url = f"http://127.0.0.1:{sock.getsockname()[1]}"
        with SyncServiceClient(url, timeout=10) as client, pytest.raises(httpx.ConnectError):
            client._call("POST", "/v1/checkpoints", json={"path": "/ckpt/v1"})
    assert SyncServiceClient._call.statistics["attempt_number"] == 5


def test_a_passage_lookup_whose_connection_drops_is_sent_again(dropping):
    with RetrieverClient(dropping.url, timeout=10) as client, pytest.raises(httpx.RemoteProtocolError):
        client.get_documents(["doc-1", "doc-2"])
    assert dropping.requests == 5


def test_the_async_client_resends_reads_and_never_a_registration(dropping):
    # The policy's retriever client is the async one: the same policy through tenacity's async retrying.
    async def scenario() -> list[int]:
        seen: list[int] = []
        async with AsyncRetrieverClient(dropping.url, timeout=10) as client:
            for call in (lambda: client.search(["q"]), lambda: client.lookup(["doc-1"]),
                         lambda: client.register("/ckpt/v1")):  # fmt: skip
                before = dropping.requests
                with pytest.raises(httpx.RemoteProtocolError):
                    await call()
                seen.append(dropping.requests - before)
        return seen

    assert asyncio.run(scenario()) == [5, 5, 1]
