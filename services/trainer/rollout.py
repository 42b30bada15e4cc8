"""Rollout collection: ask the policy service for groups, then take the logged trajectories from its Redis
stream through this run's consumer group. Entries stay pending (un-acked) until the round that used them
is published, so a worker that dies mid-round leaves them to be re-claimed, never lost or used twice."""

from __future__ import annotations

import json
import random
import time
from pathlib import Path

import redis

from services.common.checkpoints import write_json_atomic
from services.common.clients.policy import PolicyClient
from services.common.schemas.policy import RolloutItem, RolloutRequest, TrajectoryRecord
from services.trainer.run_state import RunConfig


def group_name(run_id: str) -> str:
    return f"trainer:{run_id}"


def entry_order(entry_id: str) -> tuple[int, int]:
    """A stream entry id ("<ms>-<seq>") as a sortable key: its arrival order."""
    ms, seq = entry_id.split("-")
    return int(ms), int(seq)


def ensure_group(r: redis.Redis, stream: str, run_id: str) -> None:
    try:
        r.xgroup_create(stream, group_name(run_id), id="$", mkstream=True)
    except redis.ResponseError as exc:
        if "BUSYGROUP" not in str(exc):
            raise


def round_items(config: RunConfig, rows: list[dict], round_index: int) -> list[dict]:
    """The round's questions out of the training pool `rows`: a deterministic function of (seed, round), so a
    resumed round asks the same."""
    rng = random.Random(config.algo.seed * 1_000_003 + round_index)
    return rng.sample(rows, min(config.questions_per_round, len(rows)))


def rollout_tag(run_id: str, round_index: int, collection: str = "") -> str:
    """The tag a round's trajectories carry in the stream; `collection` tells a round's second one apart."""
    return f"{run_id}/r{round_index}{'-' + collection if collection else ''}"


def request_rollouts(
    client: PolicyClient, config: RunConfig, items: list[dict], round_index: int, collection: str = ""
) -> list[str]:
    # A second collection of the round draws its own samples, not a replay of the first one's seeds.
    seed = config.algo.seed * 10_007 + round_index + (7_919 if collection else 0)
    request = RolloutRequest(
        items=[RolloutItem(id=str(i["id"]), question=i["question"], golden_answers=i["golden_answers"]) for i in items],
        group_size=config.algo.group_size,
        temperature=config.rollout_temperature,
        seed=seed,
        max_turns=config.max_turns,
        top_k=config.top_k,
        candidates=config.candidates,
        retrieval_temperature=config.retrieval_temperature,
        run_id=rollout_tag(config.run_id, round_index, collection),
        initial_search=config.initial_search,
        reward=config.reward,
    )
    return [t.trajectory_id for t in client.rollouts(request).trajectories]


def take_from_stream(
    r: redis.Redis, stream: str, run_id: str, tag: str, expected: set[str] | None, timeout_s: float = 60
) -> list[tuple[str, TrajectoryRecord]]:
    """Read (and re-claim) this run's entries until every expected trajectory is in hand.

    `expected=None` recovers what an earlier attempt of `tag` left: every entry of the tag already in the
    stream, pending or not yet read, without waiting. With a set, entries of `tag` outside it were superseded
    by a later request and are acknowledged. Entries of the run's other tags stay pending for their round."""
    group, consumer = group_name(run_id), "worker"
    found: dict[str, tuple[str, TrajectoryRecord]] = {}

    def consider(entries) -> None:
        for entry_id, fields in entries:
            if not fields:  # trimmed from the stream while pending
                continue
            record = TrajectoryRecord.model_validate_json(fields["data"])
            if record.run_id == tag and (expected is None or record.id in expected):
                found[record.id] = (entry_id, record)
            elif record.run_id == tag or record.run_id is None or not record.run_id.startswith(f"{run_id}/"):
                r.xack(stream, group, entry_id)  # superseded, or someone else's: nothing for this run to keep

    # Pending entries first: a previous attempt of this round read them and died before publishing.
    cursor = "0-0"
    while True:
        cursor, claimed, *_ = r.xautoclaim(stream, group, consumer, min_idle_time=0, start_id=cursor, count=500)
        consider(claimed)
        if cursor in ("0-0", b"0-0"):
            break
    if expected is None:
        while response := r.xreadgroup(group, consumer, {stream: ">"}, count=500):
            for _, entries in response:
                consider(entries)
        return list(found.values())
    deadline = time.monotonic() + timeout_s
    while set(found) != expected and time.monotonic() < deadline:
        response = r.xreadgroup(group, consumer, {stream: ">"}, count=500, block=1000)
        for _, entries in response or []:
            consider(entries)
    missing = expected - set(found)
    if missing:
        raise RuntimeError(f"{len(missing)} trajectories of {tag} never reached the stream {stream}")
    return list(found.values())


def complete_groups(
    entries: list[tuple[str, TrajectoryRecord]], items: list[dict], group_size: int
) -> tuple[list[tuple[str, TrajectoryRecord]], list[str]]:
    """Split recovered entries into (a full set of groups, or [] when some rollout is missing; the entry ids
    left over). One entry per (item, group index), the newest, so a re-sent request never doubles a group."""
    newest: dict[tuple[str, int], tuple[str, TrajectoryRecord]] = {}
    for entry_id, record in sorted(entries, key=lambda e: entry_order(e[0])):
        newest[(record.item_id or "", record.group_index or 0)] = (entry_id, record)
    wanted = {(str(i["id"]), g) for i in items for g in range(group_size)}
    if not wanted <= set(newest):
        return [], [e for e, _ in entries]
    kept = [newest[key] for key in sorted(wanted)]
    kept_ids = {e for e, _ in kept}
    return kept, [e for e, _ in entries if e not in kept_ids]


def save_round_rollouts(path: Path, entries: list[tuple[str, TrajectoryRecord]]) -> None:
    write_json_atomic(path, [{"entry_id": e, "record": rec.model_dump(mode="json")} for e, rec in entries])


def load_round_rollouts(path: Path) -> tuple[list[str], list[TrajectoryRecord]]:
    rows = json.loads(path.read_text())
    return [row["entry_id"] for row in rows], [TrajectoryRecord.model_validate(row["record"]) for row in rows]


def take_live(
    r: redis.Redis, stream: str, run_id: str, want: int, fresh_versions: list[str]
) -> tuple[list[tuple[str, TrajectoryRecord]], int]:
    """Up to `want` rewarded trajectories from the feedback stream, freshest first: the newest policy version's,
    then the one before it, newest entries first within a version. Served traffic outpaces a CPU trainer by an
    order of magnitude, and oldest-first trained every round on the backlog its first policy had served (a live
    run of three rounds learned from `base` only). Stale ones (a policy version outside `fresh_versions`, given
    oldest to newest) are acknowledged and dropped; fresh ones not taken stay pending for a later round.
    Returns (entries in arrival order, dropped)."""
    group, consumer = group_name(run_id), "worker"
    rank = {version: position for position, version in enumerate(fresh_versions)}
    fresh: dict[str, TrajectoryRecord] = {}
    dropped = 0

    def consider(entries) -> None:
        nonlocal dropped
        for entry_id, fields in entries:
            if not fields:
                continue
            record = TrajectoryRecord.model_validate_json(fields["data"])
            if record.reward is None or record.policy_version not in rank:
                r.xack(stream, group, entry_id)
                dropped += 1
            else:
                fresh[entry_id] = record

    cursor = "0-0"
    while True:  # what earlier rounds saw and left pending
        cursor, claimed, *_ = r.xautoclaim(stream, group, consumer, min_idle_time=0, start_id=cursor, count=500)
        consider(claimed)
        if cursor in ("0-0", b"0-0"):
            break
    while response := r.xreadgroup(group, consumer, {stream: ">"}, count=500):  # and everything new
        for _, entries in response:
            consider(entries)
    freshest = sorted(fresh, key=lambda e: (rank[fresh[e].policy_version], entry_order(e)), reverse=True)[:want]
    return [(e, fresh[e]) for e in sorted(freshest, key=entry_order)], dropped
