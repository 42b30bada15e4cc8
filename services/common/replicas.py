"""Replicas of one service that hot-swap as one, through the Redis the stack already runs.

A checkpoint registered at any replica is registered at every replica. An activation posted to any replica (the
load balancer picks one) is a two-phase swap that replica coordinates:

1. *prepare*: every live replica (a heartbeat in the group's member table) registers the version if it lacks it,
   loads it and makes it ready (`CheckpointRegistry.make_ready`), and reports `ready` or `failed: <reason>`;
2. *commit*, once every live replica has reported or `lag_bound_s` has passed: the group's current version is set,
   then every ready replica flips (`CheckpointRegistry.commit`) and reports `committed`. With no replica ready
   (the coordinator included), nothing flips: the activation is a 409 with each replica's reason.

A replica whose active version is not the group's current one (it could not load it, or it has not flipped yet)
is out of rotation: its `/readyz` is a 503, so the load balancer drains it, and an unpinned request it still gets
is a 503 the balancer retries elsewhere. It never answers at an older version than the group's, and it keeps
trying to catch up. So once the current version is set, no new request is answered at an older one; a request
that pins its version is served wherever that version loads (the trainer's rollouts). A replica that starts (or
restarts after a crash) catches up to the current version before it reports ready. Rollback is a swap to the
group's previous version.

Keys, under `bridge:replicas:<group>`: `:members` (hash: replica -> its state and heartbeat), `:current`
(the committed version, its path and the previous one), `:registered` (hash: version -> checkpoint path),
`:swap` (the lock: one swap at a time), `:swap:<id>` (hash: replica -> its report), `:events` (the channel).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
import uuid
from typing import Any, Literal

import redis.asyncio as aioredis
from pydantic import BaseModel, Field

from services.common.errors import Conflict, NotFound
from services.common.registry import CheckpointRegistry
from services.common.schemas.checkpoints import ActivationResponse

log = logging.getLogger(__name__)


class ReplicaConfig(BaseModel):
    group: str = Field(description="Replicas with the same group name swap together.")
    replica_id: str = Field(description="This replica's name in the group (unique).")
    lag_bound_s: float = Field(30.0, gt=0, description="How long a swap waits for a slow replica's report.")
    heartbeat_s: float = Field(1.0, gt=0, description="A replica silent for 3 heartbeats is not counted.")


class GroupEvent(BaseModel):
    op: Literal["register", "prepare", "commit", "abort"]
    swap: str | None = None
    version: str | None = None
    path: str | None = None
    strict_lineage: bool = False
    origin: str


class CurrentVersion(BaseModel):
    version: str
    path: str | None = None
    previous: str | None = None
    swap: str | None = None


class ReplicaGroup:
    def __init__(self, redis_url: str, config: ReplicaConfig, registry: CheckpointRegistry[Any]) -> None:
        self.config = config
        self.registry = registry
        self.redis = aioredis.Redis.from_url(redis_url, decode_responses=True)
        prefix = f"bridge:replicas:{config.group}"
        self.keys = {name: f"{prefix}:{name}" for name in ("members", "current", "registered", "swap", "events")}
        self._tasks: list[asyncio.Task] = []
        self._preparing: dict[str, asyncio.Task] = {}
        self.lag_reason: str | None = None  # why this replica is behind the group, when it is
        self._pubsub: Any = None

    # ---------------------------------------------------------------- lifecycle
    async def start(self) -> None:
        """Subscribe, catch up to the group's current version (before this replica says it is ready), then keep
        a heartbeat and a catch-up loop running."""
        self._pubsub = self.redis.pubsub()
        await self._pubsub.subscribe(self.keys["events"])
        await self.catch_up()
        await self._beat()
        self._tasks = [asyncio.create_task(self._listen()), asyncio.create_task(self._heartbeat())]

    async def stop(self) -> None:
        for task in [*self._tasks, *self._preparing.values()]:
            task.cancel()
        for task in [*self._tasks, *self._preparing.values()]:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        with contextlib.suppress(Exception):
            await self.redis.hdel(self.keys["members"], self.config.replica_id)
        if self._pubsub is not None:
            with contextlib.suppress(Exception):
                await self._pubsub.aclose()
        await self.redis.aclose()

    # ---------------------------------------------------------------- state
    async def current(self) -> CurrentVersion | None:
        raw = await self.redis.get(self.keys["current"])
        return CurrentVersion.model_validate_json(raw) if raw else None

    async def in_rotation(self) -> tuple[bool, str | None]:
        """(True, None) when this replica serves the group's current version (or the group has none yet); else
        (False, why)."""
        current = await self.current()
        if current is None or current.version == self.registry.active:
            return True, None
        return False, (
            f"this replica serves {self.registry.active}, the group is at {current.version}"
            + (f" ({self.lag_reason})" if self.lag_reason else "")
        )

    async def members(self) -> dict[str, dict[str, Any]]:
        """The live replicas (a heartbeat within 3 periods) and what each reports."""
        now = time.time()
        rows = {k: json.loads(v) for k, v in (await self.redis.hgetall(self.keys["members"])).items()}
        return {k: v for k, v in rows.items() if now - v["heartbeat"] <= 3 * self.config.heartbeat_s}

    async def _beat(self) -> None:
        row = {"version": self.registry.active, "lagging": self.lag_reason, "heartbeat": time.time()}
        await self.redis.hset(self.keys["members"], self.config.replica_id, json.dumps(row))

    async def _heartbeat(self) -> None:
        while True:
            await asyncio.sleep(self.config.heartbeat_s)
            try:
                await self._beat()
                if (await self.in_rotation())[0] is False and not self._preparing:
                    await self.catch_up()
            except Exception:  # Redis away for a moment: the next beat tries again
                log.warning("replica group %s: heartbeat failed", self.config.group, exc_info=True)

    async def catch_up(self) -> None:
        """Load and serve the group's current version when this replica is not on it (a restart, a missed swap);
        on failure stay out of rotation, with the reason, and try again at the next heartbeat."""
        current = await self.current()
        if current is None or current.version == self.registry.active:
            self.lag_reason = None
            return
        try:
            await self._ensure_registered(current.version, current.path)
            await self.registry.make_ready(current.version)
            await self.registry.commit(current.version)
            self.lag_reason = None
            log.info("replica %s caught up to %s", self.config.replica_id, current.version)
        except Exception as exc:
            self.lag_reason = f"cannot load {current.version}: {type(exc).__name__}: {exc}"[:500]
            log.warning("replica %s: %s", self.config.replica_id, self.lag_reason)

    async def _ensure_registered(self, version: str, path: str | None) -> None:
        if version in self.registry.table.checkpoints:
            return
        path = path or await self.redis.hget(self.keys["registered"], version)
        if path is None:
            raise NotFound(f"{self.registry.loader.noun} version {version!r} is not registered", param="version")
        await self.registry.register(path)

    # ---------------------------------------------------------------- changes (any replica)
    async def register(self, path: str, *, strict_lineage: bool = False) -> Any:
        """Register here, then at every replica (each checks the files itself)."""
        manifest = await self.registry.register(path, strict_lineage=strict_lineage)
        entry = self.registry.table.checkpoints[manifest.version]
        await self.redis.hset(self.keys["registered"], manifest.version, entry.path or path)
        await self._publish(GroupEvent(op="register", path=entry.path or path, strict_lineage=strict_lineage,
                                       origin=self.config.replica_id))  # fmt: skip
        return manifest

    async def activate(self, version: str) -> ActivationResponse:
        """The two-phase swap, coordinated here. Returns once every ready replica has committed (or the bound
        has passed); `replicas` says what each one reported."""
        await self._ensure_registered(version, None)
        current = await self.current()
        active = current.version if current else self.registry.active
        if version == active:
            return self._response("active", await self._states(None))
        swap = uuid.uuid4().hex[:12]
        bound = self.config.lag_bound_s
        if not await self.redis.set(self.keys["swap"], swap, nx=True, ex=int(4 * bound) + 5):
            raise Conflict("another checkpoint swap is in progress in this replica group; try again later")
        try:
            members = set(await self.members()) | {self.config.replica_id}
            path = self.registry.table.checkpoints[version].path
            await self._publish(GroupEvent(op="prepare", swap=swap, version=version, path=path,
                                           origin=self.config.replica_id))  # fmt: skip
            reports = await self._wait(swap, members, lambda r: r is not None, bound)
            ready = {m for m, r in reports.items() if r == "ready"}
            if not ready:
                await self._publish(GroupEvent(op="abort", swap=swap, version=version, origin=self.config.replica_id))
                reasons = "; ".join(f"{m}: {r or 'no report'}" for m, r in sorted(reports.items()))
                raise Conflict(f"no replica could serve {version}: {reasons}", param="version")
            await self.redis.set(self.keys["current"], CurrentVersion(
                version=version, path=path, previous=active, swap=swap).model_dump_json())  # fmt: skip
            await self._publish(GroupEvent(op="commit", swap=swap, version=version, origin=self.config.replica_id))
            reports = await self._wait(swap, ready, lambda r: r == "committed", bound)
            return self._response("active", await self._states(swap, members))
        finally:
            await self.redis.delete(self.keys["swap"])

    async def rollback(self) -> ActivationResponse:
        current = await self.current()
        previous = current.previous if current else self.registry.table.previous
        if previous is None:
            raise Conflict("there is no previous version to roll back to")
        return await self.activate(previous)

    # ---------------------------------------------------------------- events (every replica)
    async def _publish(self, event: GroupEvent) -> None:
        await self.redis.publish(self.keys["events"], event.model_dump_json())

    async def _listen(self) -> None:
        async for message in self._pubsub.listen():
            if message.get("type") != "message":
                continue
            try:
                event = GroupEvent.model_validate_json(message["data"])
            except ValueError:
                log.warning("replica group %s: not an event: %r", self.config.group, message["data"])
                continue
            if event.op == "register" and event.origin != self.config.replica_id:
                asyncio.create_task(self._register_here(event))
            elif event.op == "prepare":
                self._preparing[event.swap] = asyncio.create_task(self._prepare_here(event))
            elif event.op == "commit":
                asyncio.create_task(self._commit_here(event))
            elif event.op == "abort":
                self._preparing.pop(event.swap, None)

    async def _register_here(self, event: GroupEvent) -> None:
        try:
            await self.registry.register(event.path, strict_lineage=event.strict_lineage)
        except Exception as exc:  # it is retried at prepare and at catch-up: say so, keep serving
            log.warning("replica %s could not register %s: %s", self.config.replica_id, event.path, exc)

    async def _prepare_here(self, event: GroupEvent) -> bool:
        try:
            await self._ensure_registered(event.version, event.path)
            await self.registry.make_ready(event.version)
        except Exception as exc:
            report = f"failed: {type(exc).__name__}: {exc}"[:500]
            log.warning("replica %s cannot serve %s: %s", self.config.replica_id, event.version, report)
            await self._report(event.swap, report)
            return False
        await self._report(event.swap, "ready")
        return True

    async def _commit_here(self, event: GroupEvent) -> None:
        """Flip when this replica's prepare for the swap succeeded; else it stays out of rotation (catch_up
        retries at every heartbeat)."""
        preparing = self._preparing.pop(event.swap, None)
        if preparing is None:
            return
        try:
            prepared = await asyncio.wait_for(asyncio.shield(preparing), self.config.lag_bound_s)
        except Exception:
            prepared = False
        if not prepared:
            return
        try:
            await self.registry.commit(event.version)
            self.lag_reason = None
            await self._report(event.swap, "committed")
            await self._beat()
        except Exception as exc:
            self.lag_reason = f"cannot serve {event.version}: {type(exc).__name__}: {exc}"[:500]
            await self._report(event.swap, f"failed: {self.lag_reason}")

    async def _report(self, swap: str, report: str) -> None:
        key = f"{self.keys['swap']}:{swap}"
        await self.redis.hset(key, self.config.replica_id, report)
        await self.redis.expire(key, 3600)

    async def _wait(self, swap: str, members: set[str], done: Any, bound: float) -> dict[str, str | None]:
        """Each member's report once `done(report)` holds for all of them, or when `bound` seconds have passed."""
        deadline = time.monotonic() + bound
        while True:
            got = await self.redis.hgetall(f"{self.keys['swap']}:{swap}")
            reports = {m: got.get(m) for m in members}
            if all(done(r) for r in reports.values()) or time.monotonic() > deadline:
                return reports
            await asyncio.sleep(0.02)

    async def _states(self, swap: str | None, members: set[str] | None = None) -> dict[str, str]:
        live = await self.members()
        got = await self.redis.hgetall(f"{self.keys['swap']}:{swap}") if swap else {}
        names = sorted(set(live) | (members or set()))
        return {m: got.get(m) or (f"serving {live[m]['version']}" if m in live else "no report") for m in names}

    def _response(self, status: str, replicas: dict[str, str]) -> ActivationResponse:
        table = self.registry.table
        return ActivationResponse(active=table.active, previous=table.previous, status=status, replicas=replicas)
