"""Real Redis: a trajectory's feedback is stored and announced on the feedback stream once; a second one, racing or
late, writes nothing (it would be a second training sample of the same answer)."""

from __future__ import annotations

import asyncio
import os
import uuid

from services.common.schemas.policy import TrajectoryRecord
from services.policy.store import TrajectoryStore
from services.policy.stream_bound import StreamBound


def test_feedback_is_announced_once_per_trajectory():
    async def run() -> None:
        tag = uuid.uuid4().hex[:8]
        url = os.environ.get("BRIDGE_TEST_REDIS_URL", "redis://127.0.0.1:6379/0")
        store = TrajectoryStore(url, f"test:traj:{tag}", f"test:feedback:{tag}", StreamBound(100, 200, 3600), ttl_s=60)
        record = TrajectoryRecord(id=f"t-{tag}", question="q?", prompt="p", prompt_ids=[1], turns=[], answer="a",
                                  policy_version="base", retriever_version="base", created_at=0.0)  # fmt: skip
        try:
            await store.append([record])
            results = await asyncio.gather(*(store.set_reward(record.model_copy(update={"reward": r}))
                                             for r in (1.0, 0.0, 0.5)))  # fmt: skip
            assert sorted(results) == [False, False, True]
            assert await store.redis.xlen(store.feedback_stream) == 1
            stored = await store.get(record.id)
            [(_, event)] = await store.redis.xrange(store.feedback_stream)
            assert stored.reward == TrajectoryRecord.model_validate_json(event["data"]).reward  # what trained
        finally:
            await store.redis.delete(store.stream, store.feedback_stream, store.key(record.id),
                                     store.feedback_key(record.id))  # fmt: skip
            await store.close()

    asyncio.run(run())
