"""Trajectories in Redis: each record under its own key (for GET by id and feedback) and appended to a
stream that the trainer reads through a consumer group, bounded without dropping what a run needs
(`stream_bound.py`). Written before the response returns,
so a trajectory a client has seen is never lost to a crash of this process."""

from __future__ import annotations

import functools
import json
from collections.abc import Awaitable, Callable
from typing import ParamSpec, TypeVar

import redis.asyncio as aioredis
from redis.asyncio.retry import Retry  # the async one: redis.retry.Retry would not await, so never retry
from redis.backoff import ExponentialBackoff
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from services.common.errors import DependencyUnavailable, NotFound
from services.common.schemas.policy import TrajectoryRecord
from services.policy.stream_bound import StreamBound, trim

P = ParamSpec("P")
T = TypeVar("T")
RETRIES = 8
BACKOFF_CAP_S = 2.0


def _unavailable_as_503(method: Callable[P, Awaitable[T]]) -> Callable[P, Awaitable[T]]:
    """Redis still down after the retries: a 503 with the reason, not a stray 500."""

    @functools.wraps(method)
    async def wrapper(*args: P.args, **kwargs: P.kwargs) -> T:
        try:
            return await method(*args, **kwargs)
        except (RedisConnectionError, RedisTimeoutError) as exc:
            raise DependencyUnavailable(
                f"trajectory store (Redis) unavailable: {exc}", code="redis_unavailable"
            ) from exc

    return wrapper


# KEYS: the feedback marker, the record, the feedback stream; ARGV: ttl, record json, id, reward. Returns the
# feedback stream's length after the XADD (for its trim), 0 when the trajectory was rewarded before.
_REWARD_ONCE = """
if not redis.call('SET', KEYS[1], '1', 'NX', 'EX', ARGV[1]) then return 0 end
redis.call('SET', KEYS[2], ARGV[2], 'EX', ARGV[1])
redis.call('XADD', KEYS[3], '*', 'id', ARGV[3], 'reward', ARGV[4], 'data', ARGV[2])
return redis.call('XLEN', KEYS[3])
"""


class TrajectoryStore:
    def __init__(
        self,
        url: str,
        stream: str,
        feedback_stream: str,
        bound: StreamBound,
        ttl_s: int,
        on_pinned_trim: Callable[[str, int], None] = lambda stream, count: None,
    ) -> None:
        # Reconnect with backoff when Redis restarts, instead of failing the request on the first error.
        # About 11 s of retries in all (0.2, 0.4, ... capped at 2 s): a Redis restart inside that window is invisible
        # to callers.
        retry = Retry(ExponentialBackoff(cap=BACKOFF_CAP_S, base=0.1), retries=RETRIES)
        self.redis = aioredis.from_url(
            url,
            decode_responses=True,
            retry=retry,
            retry_on_error=[RedisConnectionError, RedisTimeoutError],
            socket_timeout=10,
            health_check_interval=30,
        )
        self.stream = stream
        self.feedback_stream = feedback_stream
        self.bound = bound
        self.ttl_s = ttl_s
        self.on_pinned_trim = on_pinned_trim

    @staticmethod
    def key(trajectory_id: str) -> str:
        return f"bridge:trajectory:{trajectory_id}"

    @_unavailable_as_503
    async def ping(self) -> bool:
        return bool(await self.redis.ping())

    @_unavailable_as_503
    async def append(self, records: list[TrajectoryRecord]) -> list[str]:
        async with self.redis.pipeline(transaction=True) as pipe:
            for record in records:
                data = record.model_dump_json()
                pipe.set(self.key(record.id), data, ex=self.ttl_s)
                pipe.xadd(self.stream, {"id": record.id, "data": data})
            pipe.xlen(self.stream)  # in the same round trip: what the trim needs
            results = await pipe.execute()
        await trim(self.redis, self.stream, self.bound, self.on_pinned_trim, results[-1])
        return results[1:-1:2]

    @_unavailable_as_503
    async def get(self, trajectory_id: str) -> TrajectoryRecord:
        data = await self.redis.get(self.key(trajectory_id))
        if data is None:
            raise NotFound(f"no trajectory {trajectory_id!r} (unknown or expired)", param="trajectory_id")
        return TrajectoryRecord.model_validate_json(data)

    @_unavailable_as_503
    async def latest(self, count: int) -> list[TrajectoryRecord]:
        """The newest `count` trajectories of the stream, as they are now (with any reward given since)."""
        entries = await self.redis.xrevrange(self.stream, count=count)
        ids = list(dict.fromkeys(fields["id"] for _, fields in entries))
        if not ids:
            return []
        found = await self.redis.mget([self.key(i) for i in ids])
        return [TrajectoryRecord.model_validate_json(data) for data in found if data is not None]

    @staticmethod
    def feedback_key(trajectory_id: str) -> str:
        return f"bridge:feedback:{trajectory_id}"

    @_unavailable_as_503
    async def set_reward(self, record: TrajectoryRecord) -> bool:
        """Store the rewarded record and announce it on the feedback stream (live learning reads it), once per
        trajectory: False, and nothing written, when it was rewarded before. One script, so two racing requests
        cannot both announce (a second event would be a second training sample of the same answer)."""
        data = record.model_dump_json()
        keys = [self.feedback_key(record.id), self.key(record.id), self.feedback_stream]
        args = [self.ttl_s, data, record.id, json.dumps(record.reward)]
        length = await self.redis.eval(_REWARD_ONCE, len(keys), *keys, *args)  # 0: given before
        if length:
            await trim(self.redis, self.feedback_stream, self.bound, self.on_pinned_trim, length)
        return bool(length)

    async def close(self) -> None:
        await self.redis.aclose()
