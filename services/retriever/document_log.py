"""Document writes shared by a replica group's embedded indexes, through a Redis stream.

The embedded index (Qdrant Edge) is opened by one process, so each replica of the embedded default keeps its own.
A write posted to any replica (an upsert batch, a delete) is appended to the group's stream
`bridge:replicas:<group>:documents`; every replica applies the stream's entries in stream order, one at a time,
and records how far it got (in its state dir and in the group's `:documents:applied` hash). So every index holds
the same documents; a replica that starts, or restarts after a crash, replays what it has not applied before it
says it is ready (a new one replays the whole stream). A write is answered once the replica that took it has
applied it and every live replica has too, or `lag_bound_s` has passed (the response names the ones behind).
Applying an entry twice is harmless (an upsert of unchanged content is skipped by its hash, a delete of a missing
id does nothing), so a crash between applying and recording costs nothing. A replica that cannot apply an entry
retries it and is out of rotation until it has (it would answer from an index missing a write).

With a shared Qdrant server (QDRANT_URL) there is one index and no stream. The stream is never trimmed: it is
what a new replica is built from (the Redis of a deployment keeps it on disk: compose and the launcher run Redis
with an append-only file).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, Literal

import redis.asyncio as aioredis
from pydantic import BaseModel, Field

from services.common.schemas.retriever import Document

log = logging.getLogger(__name__)


class DocumentWrite(BaseModel):
    op: Literal["upsert", "delete"]
    documents: list[Document] = Field(default_factory=list, description="upsert: the batch")
    ids: list[str] = Field(default_factory=list, description="delete: the ids")
    token: str = Field(default_factory=lambda: uuid.uuid4().hex, description="matches the write to its caller")
    origin: str


def _order(entry_id: str) -> tuple[int, int]:
    ms, _, seq = entry_id.partition("-")
    return int(ms), int(seq or 0)


class DocumentLog:
    """`apply(write)` applies one write to this replica's index and returns what the caller of `write` gets."""

    def __init__(self, redis_url: str, group: str, replica_id: str, state_dir: Path,
                 apply: Callable[[DocumentWrite], Awaitable[Any]], *, lag_bound_s: float = 30.0) -> None:  # fmt: skip
        self.redis = aioredis.Redis.from_url(redis_url, decode_responses=True)
        self.stream = f"bridge:replicas:{group}:documents"
        self.applied_key = f"{self.stream}:applied"
        self.replica_id = replica_id
        self.offset_file = state_dir / "documents.offset"
        self.apply = apply
        self.lag_bound_s = lag_bound_s
        self.applied = self.offset_file.read_text().strip() if self.offset_file.exists() else "0-0"
        self.failing: str | None = None  # why the next entry does not apply here, while it does not
        self._waiting: dict[str, asyncio.Future] = {}
        self._task: asyncio.Task | None = None

    async def start(self) -> None:
        """Replay every entry this replica has not applied, then follow the stream."""
        while await self._apply_next(block_ms=None):
            pass
        await self._record()
        self._task = asyncio.create_task(self._follow())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._task
        await self.redis.aclose()

    async def write(self, write: DocumentWrite, live: Callable[[], Awaitable[set[str]]]) -> tuple[Any, list[str]]:
        """Append `write`; (what applying it here returned, the live replicas still behind after the bound)."""
        done = asyncio.get_running_loop().create_future()
        self._waiting[write.token] = done
        try:
            entry = await self.redis.xadd(self.stream, {"write": write.model_dump_json()})
            result = await done
        finally:
            self._waiting.pop(write.token, None)
        return result, await self._behind(entry, live)

    async def _behind(self, entry: str, live: Callable[[], Awaitable[set[str]]]) -> list[str]:
        deadline = time.monotonic() + self.lag_bound_s
        while True:
            applied = await self.redis.hgetall(self.applied_key)
            behind = sorted(m for m in await live() if _order(applied.get(m, "0-0")) < _order(entry))
            if not behind or time.monotonic() > deadline:
                return behind
            await asyncio.sleep(0.02)

    async def _follow(self) -> None:
        while True:
            try:
                await self._apply_next(block_ms=1000)
            except asyncio.CancelledError:
                raise
            except Exception:  # Redis away for a moment: try again
                log.warning("document log %s: reading the stream failed", self.stream, exc_info=True)
                await asyncio.sleep(1)

    async def _apply_next(self, block_ms: int | None) -> bool:
        """Apply the entries after `self.applied` (up to 64); False when there were none."""
        read = await self.redis.xread({self.stream: self.applied}, count=64, block=block_ms)
        entries = [e for _, rows in read for e in rows]
        for entry_id, fields in entries:
            write = DocumentWrite.model_validate_json(fields["write"])
            result = await self._apply_until_done(write)
            self.applied = entry_id
            await self._record()
            waiting = self._waiting.get(write.token)
            if waiting is not None and not waiting.done():
                waiting.set_result(result)
        return bool(entries)

    async def _apply_until_done(self, write: DocumentWrite) -> Any:
        while True:
            try:
                result = await self.apply(write)
                self.failing = None
                return result
            except Exception as exc:  # never skipped: every replica must hold every write
                self.failing = f"cannot apply a document {write.op}: {type(exc).__name__}: {exc}"[:500]
                log.warning("replica %s: %s (retrying)", self.replica_id, self.failing)
                waiting = self._waiting.get(write.token)
                if waiting is not None and not waiting.done():  # the caller hears it now; the log goes on trying
                    waiting.set_exception(exc)
                await asyncio.sleep(2)

    async def _record(self) -> None:
        tmp = self.offset_file.with_suffix(".tmp")
        tmp.write_text(self.applied)
        os.replace(tmp, self.offset_file)
        await self.redis.hset(self.applied_key, self.replica_id, self.applied)
