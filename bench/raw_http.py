"""A lean HTTP/1.1 load generator for the benches: one keep-alive connection per client, request bodies serialized
before the clock starts, responses read by their Content-Length (or chunks) and checked for a 2xx status.

Why not httpx: on a 2-core machine the benches' clients share the cores with the server they measure, and httpx's
AsyncClient spends about a millisecond of CPU on a small request, which is CPU the server does not get. A load
generator should cost the system under test as little as it can (what wrk or vegeta do); this one does only the
bytes. Both servers a bench compares see the same client.
"""

from __future__ import annotations

import asyncio
from urllib.parse import urlsplit


class HTTPStatusError(RuntimeError):
    pass


class RawConnection:
    """One keep-alive HTTP/1.1 connection; `send` sends a request made by `request_bytes` and returns the response's
    body."""

    def __init__(self, url: str) -> None:
        parts = urlsplit(url)
        self.host, self.port = parts.hostname or "127.0.0.1", parts.port or 80
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None

    async def __aenter__(self) -> RawConnection:
        self.reader, self.writer = await asyncio.open_connection(self.host, self.port)
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self.writer is not None:
            self.writer.close()
            await self.writer.wait_closed()

    def request_bytes(self, path: str, body: bytes) -> bytes:
        head = (f"POST {path} HTTP/1.1\r\nHost: {self.host}:{self.port}\r\nContent-Type: application/json\r\n"
                f"Content-Length: {len(body)}\r\n\r\n")  # fmt: skip
        return head.encode("ascii") + body

    async def send(self, request: bytes) -> bytes:
        """Send a request made by `request_bytes`; the response body (raises on a non-2xx status)."""
        assert self.reader is not None and self.writer is not None, "use `async with RawConnection(url)`"
        self.writer.write(request)
        head = await self.reader.readuntil(b"\r\n\r\n")
        status_line, *header_lines = head.decode("latin-1").split("\r\n")
        status = int(status_line.split(" ", 2)[1])
        headers = {}
        for line in header_lines:
            if line:
                name, _, value = line.partition(":")
                headers[name.strip().lower()] = value.strip()
        if "content-length" in headers:
            body = await self.reader.readexactly(int(headers["content-length"]))
        elif headers.get("transfer-encoding", "").lower() == "chunked":
            body = await self.read_chunks()
        else:
            raise HTTPStatusError(f"{status}: a response with neither Content-Length nor chunks")
        if not 200 <= status < 300:
            raise HTTPStatusError(f"{status}: {body[:200]!r}")
        return body

    async def read_chunks(self) -> bytes:
        assert self.reader is not None
        parts = []
        while True:
            size = int((await self.reader.readuntil(b"\r\n")).split(b";")[0], 16)
            if size == 0:
                await self.reader.readuntil(b"\r\n")  # no trailers are sent by our servers: the final CRLF
                return b"".join(parts)
            parts.append(await self.reader.readexactly(size))
            await self.reader.readexactly(2)
