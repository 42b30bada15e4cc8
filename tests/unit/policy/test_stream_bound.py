"""Real Redis: the trajectory stream is trimmed towards its bound without dropping what a training run's consumer
group still needs (pending for it, or not yet read), except past the hard cap, and then loudly."""

from __future__ import annotations

import asyncio
import os
import uuid

from services.common.schemas.policy import TrajectoryRecord
from services.policy.store import TrajectoryStore
from services.policy.stream_bound import StreamBound

URL = os.environ.get("BRIDGE_TEST_REDIS_URL", "redis://127.0.0.1:6379/0")
PREFIX = uuid.uuid4().hex[:8]  # this module's trajectory ids, so its clean-up deletes only its own records


def record(n: int) -> TrajectoryRecord:
    return TrajectoryRecord(id=f"{PREFIX}-{n}-{uuid.uuid4().hex[:6]}", question="q?", prompt="p", prompt_ids=[1],
                            turns=[], answer="a", policy_version="base", retriever_version="base",
                            created_at=0.0)  # fmt: skip


def with_store(bound: StreamBound, body) -> list[tuple[str, int]]:
    trimmed: list[tuple[str, int]] = []

    async def run() -> None:
        tag = uuid.uuid4().hex[:8]
        store = TrajectoryStore(URL, f"test:traj:{tag}", f"test:feedback:{tag}", bound, ttl_s=60,
                                on_pinned_trim=lambda stream, count: trimmed.append((stream, count)))  # fmt: skip
        try:
            await body(store)
        finally:
            keys = [key async for key in store.redis.scan_iter(f"bridge:trajectory:{PREFIX}-*")]
            await store.redis.delete(store.stream, store.feedback_stream, *keys)
            await store.close()

    asyncio.run(run())
    return trimmed


def test_a_runs_pending_and_unread_entries_survive_trimming_and_acknowledged_ones_go():
    async def body(store: TrajectoryStore) -> None:
        r = store.redis
        await r.xgroup_create(store.stream, "trainer:run", id="$", mkstream=True)
        await store.append([record(n) for n in range(150)])
        await r.xreadgroup("trainer:run", "worker", {store.stream: ">"}, count=50)  # 50 pending, 100 unread
        await store.append([record(n) for n in range(300)])  # 450 in all, over a bound of 100
        assert await r.xlen(store.stream) == 450  # the run needs every one of them
        pending = await r.xpending_range(store.stream, "trainer:run", "-", "+", 50)
        await r.xack(store.stream, "trainer:run", *(p["message_id"] for p in pending[:40]))
        await r.xreadgroup("trainer:run", "worker", {store.stream: ">"}, count=200)
        await store.append([record(0)])
        entries = {entry_id for entry_id, _ in await r.xrange(store.stream)}
        assert {p["message_id"] for p in pending[40:]} <= entries  # still pending: kept
        assert len(entries) < 451  # acknowledged ones trimmed

    assert with_store(StreamBound(maxlen=100, hard_maxlen=10_000, group_idle_s=3600), body) == []


def test_a_stream_no_run_reads_is_trimmed_to_its_bound():
    async def body(store: TrajectoryStore) -> None:
        await store.append([record(n) for n in range(500)])
        assert 100 <= await store.redis.xlen(store.stream) <= 300

    assert with_store(StreamBound(maxlen=100, hard_maxlen=10_000, group_idle_s=3600), body) == []


def test_past_the_hard_cap_needed_entries_are_trimmed_loudly():
    async def body(store: TrajectoryStore) -> None:
        await store.redis.xgroup_create(store.stream, "trainer:run", id="$", mkstream=True)
        await store.redis.xreadgroup("trainer:run", "worker", {store.stream: ">"}, count=1)  # a consumer, active
        await store.append([record(n) for n in range(700)])  # none read: all needed
        assert await store.redis.xlen(store.stream) <= 500

    [(stream, count)] = with_store(StreamBound(maxlen=100, hard_maxlen=300, group_idle_s=3600), body)
    assert stream.startswith("test:traj:") and count >= 300


def test_a_group_idle_past_its_limit_holds_nothing_back():
    async def body(store: TrajectoryStore) -> None:
        await store.redis.xgroup_create(store.stream, "trainer:left", id="$", mkstream=True)
        await store.append([record(n) for n in range(100)])
        await store.redis.xreadgroup("trainer:left", "worker", {store.stream: ">"}, count=100)
        await asyncio.sleep(0.05)
        await store.append([record(n) for n in range(400)])
        assert await store.redis.xlen(store.stream) <= 300

    assert with_store(StreamBound(maxlen=100, hard_maxlen=10_000, group_idle_s=0.01), body) == []


def test_feedback_stream_keeps_what_a_live_run_has_not_read():
    async def body(store: TrajectoryStore) -> None:
        await store.redis.xgroup_create(store.feedback_stream, "trainer:live", id="$", mkstream=True)
        records = [record(n) for n in range(250)]
        await store.append(records)
        for rec in records:
            await store.set_reward(rec.model_copy(update={"reward": 1.0}))
        assert await store.redis.xlen(store.feedback_stream) == 250

    assert with_store(StreamBound(maxlen=100, hard_maxlen=10_000, group_idle_s=3600), body) == []
