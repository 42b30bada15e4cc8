"""Rollout collection: ask the policy service for groups, then take the logged trajectories from its Redis
stream through this run's consumer group. Entries stay pending (un-acked) until the round that used them
is published, so a worker that dies mid-round leaves them to be re-claimed, never lost or used twice."""

from __future__ import annotations

import json
import logging
import random
import time
from pathlib import Path
from typing import NamedTuple

import redis

from services.common.checkpoints import write_json_atomic
from services.common.clients.policy import PolicyClient
from services.common.schemas.policy import RolloutItem, RolloutRequest, TrajectoryRecord
from services.trainer.run_state import RunConfig

log = logging.getLogger(__name__)


def group_name(run_id: str) -> str:
    return f"trainer:{run_id}"


def entry_order(entry_id: str) -> tuple[int, int]:
    """A stream entry id ("<ms>-<seq>") as a sortable key: its arrival order."""
    ms, seq = entry_id.split("-")
    return int(ms), int(seq)


def ensure_group(r: redis.Redis, stream: str, run_id: str) -> None:
    """The run's consumer group, created unless it exists: at the start, and again at every read, since a Redis
    restarted without persistence comes back without it (a resumed run then failed with NOGROUP). A group made
    anew reads from now on: what the lost one held is gone with the stream, and a dataset round asks again."""
    try:
        r.xgroup_create(stream, group_name(run_id), id="$", mkstream=True)
    except redis.ResponseError as exc:
        if "BUSYGROUP" not in str(exc):
            raise


def drop_group(r: redis.Redis, stream: str, run_id: str) -> None:
    """A finished run's group: gone, so that it holds no entries back from the policy service's trimming."""
    r.xgroup_destroy(stream, group_name(run_id))


class EntriesTrimmed(RuntimeError):
    """Entries the run needed were trimmed from the stream before it used them (the policy service's
    stream_hard_maxlen was reached, or the run's group sat idle past stream_group_idle_s)."""


def claim_pending(r: redis.Redis, stream: str, run_id: str) -> tuple[list, int]:
    """(every entry pending for the run, claimed by its one consumer; how many pending entries were trimmed from
    the stream meanwhile). Redis drops those from the pending list as it reports them, so they are counted now
    or never."""
    group, consumer = group_name(run_id), "worker"
    claimed_all, lost, cursor = [], 0, "0-0"
    while True:
        cursor, claimed, *deleted = r.xautoclaim(stream, group, consumer, min_idle_time=0, start_id=cursor, count=500)
        lost += len(deleted[0]) if deleted else 0  # Redis 7 lists them; 6.2 gives them with no fields
        lost += sum(1 for _, fields in claimed if not fields)
        claimed_all.extend((entry_id, fields) for entry_id, fields in claimed if fields)
        if cursor in ("0-0", b"0-0"):
            return claimed_all, lost


def round_items(config: RunConfig, rows: list[dict], round_index: int) -> list[dict]:
    """The round's questions out of the training pool `rows`: a deterministic function of (seed, round), so a
    resumed round asks the same."""
    rng = random.Random(config.algo.seed * 1_000_003 + round_index)
    return rng.sample(rows, min(config.questions_per_round, len(rows)))


def rollout_tag(run_id: str, round_index: int, collection: str = "") -> str:
    """The tag a round's trajectories carry in the stream; `collection` tells a round's second one apart."""
    return f"{run_id}/r{round_index}{'-' + collection if collection else ''}"


def request_rollouts(
    client: PolicyClient,
    config: RunConfig,
    items: list[dict],
    round_index: int,
    collection: str = "",
    versions: tuple[str, str] | None = None,
) -> list[str]:
    """`versions`: (policy, retriever) the rollouts must come from, the run's own; the service serves at them or
    refuses (409)."""
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
        **({} if versions is None else {"policy_version": versions[0], "retriever_version": versions[1]}),
    )
    return [t.trajectory_id for t in client.rollouts(request).trajectories]


class VersionMismatch(RuntimeError):
    """Trajectories from versions other than the run's: training on them would learn from another policy's
    samples (a permanent error: the run fails with this reason, nothing retries it)."""


def check_versions(records: list[TrajectoryRecord], policy: str, retriever: str) -> None:
    """Every record was generated by `policy` and every one of its searches served by `retriever`."""
    wrong = []
    for r in records:
        searched = {t.search.retriever_version for t in r.turns if t.search is not None}
        if r.policy_version != policy or searched - {retriever}:
            wrong.append(f"{r.id} (policy {r.policy_version}, retriever {', '.join(sorted(searched)) or '-'})")
    if wrong:
        raise VersionMismatch(
            f"{len(wrong)} of {len(records)} trajectories are not from the run's policy {policy} and retriever "
            f"{retriever}: {'; '.join(wrong[:3])}"
        )


def take_from_stream(
    r: redis.Redis, stream: str, run_id: str, tag: str, expected: set[str] | None, timeout_s: float = 60
) -> list[tuple[str, TrajectoryRecord]]:
    """Read (and re-claim) this run's entries until every expected trajectory is in hand.

    `expected=None` recovers what an earlier attempt of `tag` left: every entry of the tag already in the
    stream, pending or not yet read, without waiting. With a set, entries of `tag` outside it were superseded
    by a later request and are acknowledged. Entries of the run's other tags stay pending for their round."""
    ensure_group(r, stream, run_id)
    group, consumer = group_name(run_id), "worker"
    found: dict[str, tuple[str, TrajectoryRecord]] = {}

    def consider(entries) -> None:
        for entry_id, fields in entries:
            record = TrajectoryRecord.model_validate_json(fields["data"])
            if record.run_id == tag and (expected is None or record.id in expected):
                found[record.id] = (entry_id, record)
            elif record.run_id == tag or record.run_id is None or not record.run_id.startswith(f"{run_id}/"):
                r.xack(stream, group, entry_id)  # superseded, or someone else's: nothing for this run to keep

    # Pending entries first: a previous attempt of this round read them and died before publishing.
    claimed, lost = claim_pending(r, stream, run_id)
    if lost:
        log.warning("run %s: %d of its pending entries were trimmed from %s before it used them", run_id, lost, stream)
    consider(claimed)
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
    if missing and lost:
        raise EntriesTrimmed(
            f"{len(missing)} trajectories of {tag} are missing and {lost} of the run's pending "
            f"entries were trimmed from {stream}: see the policy service's stream_hard_maxlen"
        )
    if missing:
        raise RuntimeError(
            f"{len(missing)} trajectories of {tag} never reached the stream {stream} (or were trimmed "
            "before this run read them: see bridge_policy_stream_needed_trimmed_total)"
        )
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


class LiveTake(NamedTuple):
    entries: list[tuple[str, TrajectoryRecord]]  # in arrival order
    dropped: int  # stale, unrewarded or repeated: acknowledged
    lost: int  # pending for the run, then trimmed from the stream before a round took them
    feedback: list[tuple[str, float]]  # (policy version, reward) of every rewarded entry read for the first time


def take_live(r: redis.Redis, stream: str, run_id: str, want: int, fresh_versions: list[str]) -> LiveTake:
    """Up to `want` rewarded trajectories from the feedback stream, freshest first: the newest policy version's,
    then the one before it, newest entries first within a version. Served traffic outpaces a CPU trainer by an
    order of magnitude, and oldest-first trained every round on the backlog its first policy had served (a live
    run of three rounds learned from `base` only). Stale ones (a policy version outside `fresh_versions`, given
    oldest to newest) are acknowledged and dropped; fresh ones not taken stay pending for a later round.
    A trajectory is taken once: a later entry for the same trajectory id is dropped."""
    ensure_group(r, stream, run_id)
    group, consumer = group_name(run_id), "worker"
    rank = {version: position for position, version in enumerate(fresh_versions)}
    fresh: dict[str, TrajectoryRecord] = {}
    taken_ids: set[str] = set()
    dropped = 0
    feedback: list[tuple[str, float]] = []

    def consider(entries, first_read: bool = False) -> None:
        nonlocal dropped
        for entry_id, fields in entries:
            record = TrajectoryRecord.model_validate_json(fields["data"])
            if first_read and record.reward is not None:  # a group delivers an entry once: counted once
                feedback.append((record.policy_version, record.reward))
            if record.reward is None or record.policy_version not in rank or record.id in taken_ids:
                # the same trajectory twice (a feedback stream fed by other writers): one training sample
                r.xack(stream, group, entry_id)
                dropped += 1
            else:
                fresh[entry_id] = record
                taken_ids.add(record.id)

    claimed, lost = claim_pending(r, stream, run_id)  # what earlier rounds saw and left pending
    if lost:
        log.warning("run %s: %d of its pending live trajectories were trimmed from %s", run_id, lost, stream)
    consider(claimed)
    while response := r.xreadgroup(group, consumer, {stream: ">"}, count=500):  # and everything new
        for _, entries in response:
            consider(entries, first_read=True)
    freshest = sorted(fresh, key=lambda e: (rank[fresh[e].policy_version], entry_order(e)), reverse=True)[:want]
    return LiveTake([(e, fresh[e]) for e in sorted(freshest, key=entry_order)], dropped, lost, feedback)
