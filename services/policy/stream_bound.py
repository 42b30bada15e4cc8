"""Keeping a trajectory stream bounded without dropping what a training run still needs.

A trainer's consumer group holds entries pending until the round that used them is published, and reads the
entries after its last-delivered id as they come. Trimming by count alone (XADD MAXLEN) dropped both under heavy
traffic: a dataset round then waited 60 s for rollouts that were gone, a live round skipped them unseen. So the
stream is trimmed to `maxlen` only below the oldest entry an active group still needs, and past `hard_maxlen`
(memory comes first) by count, loudly: a warning naming the groups and a counter the operator can alert on. A group
whose consumers have all been idle for `group_idle_s` (a run that failed and was left) no longer holds entries
back; if its run is resumed later, the trainer reports what was trimmed instead of waiting for it."""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass

import redis.asyncio as aioredis

log = logging.getLogger(__name__)

# One radix-tree node of a stream (stream-node-max-entries): approximate trimming removes whole nodes, so checking
# more often than once a node over the bound would only cost round trips.
TRIM_SLACK = 100


@dataclass(frozen=True)
class StreamBound:
    maxlen: int
    hard_maxlen: int
    group_idle_s: float


def entry_key(entry_id: str) -> tuple[int, int]:
    ms, _, seq = entry_id.partition("-")
    return int(ms), int(seq or 0)


def following(entry_id: str) -> str:
    """The smallest entry id after `entry_id`."""
    ms, seq = entry_key(entry_id)
    return f"{ms}-{seq + 1}"


async def needed_from(redis: aioredis.Redis, stream: str, group_idle_s: float) -> tuple[str | None, list[str]]:
    """(the oldest entry id an active consumer group still needs, or None when no group needs any; the names of
    the groups that hold entries back). A group needs its pending entries and everything after its last-delivered
    id; a group with no consumer yet was just created (it reads from then on)."""
    floors: dict[str, str] = {}
    for group in await redis.xinfo_groups(stream):
        name = group["name"]
        if group["consumers"]:
            consumers = await redis.xinfo_consumers(stream, name)
            if min(c["idle"] for c in consumers) > group_idle_s * 1000:
                continue
        floor = following(group["last-delivered-id"])
        if group["pending"]:
            oldest = (await redis.xpending(stream, name))["min"]
            floor = min(floor, oldest, key=entry_key)
        floors[name] = floor
    if not floors:
        return None, []
    return min(floors.values(), key=entry_key), sorted(floors)


async def trim(
    redis: aioredis.Redis,
    stream: str,
    bound: StreamBound,
    on_pinned_trim: Callable[[str, int], None],
    length: int,
) -> int:
    """Trim `stream` (`length` entries, as the writer's own XLEN read it along with its XADD) towards
    `bound.maxlen`, sparing what active groups need; past `bound.hard_maxlen`, by count. Returns the entries
    removed. `on_pinned_trim(stream, count)` hears of every entry removed that a group needed."""
    if length <= bound.maxlen + TRIM_SLACK:
        return 0
    floor, holders = await needed_from(redis, stream, bound.group_idle_s)
    if floor is None:
        removed = await redis.xtrim(stream, maxlen=bound.maxlen, approximate=True)
    else:  # LIMIT: never more than the excess, and (approximate MINID) never an entry at or after the floor
        removed = await redis.xtrim(stream, minid=floor, approximate=True, limit=length - bound.maxlen)
    length -= removed
    if length > bound.hard_maxlen + TRIM_SLACK:
        dropped = await redis.xtrim(stream, maxlen=bound.hard_maxlen, approximate=True)
        removed += dropped
        log.warning(
            "stream %s: %d entries over the hard cap of %d are trimmed though consumer groups %s still need them "
            "(their runs will report them lost): raise stream_hard_maxlen or stop the runs that fell behind",
            stream, dropped, bound.hard_maxlen, ", ".join(holders),
        )  # fmt: skip
        on_pinned_trim(stream, dropped)
    return removed
