"""The round plan the Celery chain follows, the fresh-mode config rules, and recovering a collection."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from services.common.schemas.policy import TrajectoryRecord
from services.trainer.algo.config import AlgoConfig
from services.trainer.plan import first_phase, next_step, round_steps
from services.trainer.rollout import complete_groups, rollout_tag
from services.trainer.run_state import RunConfig


def test_reweighted_round_is_collect_train_publish():
    cfg = AlgoConfig(algo="bridge")
    assert round_steps(cfg) == [("collect", "round"), ("train", "round"), ("publish", "round")]
    assert next_step(cfg, 3, "train", "round") == (3, "publish", "round")
    assert next_step(cfg, 3, "publish", "round") == (4, "collect", "round")


def test_fresh_round_publishes_the_retriever_before_collecting_for_the_policy():
    cfg = AlgoConfig(algo="bridge", policy_rollouts="fresh")
    assert first_phase(cfg) == "retriever"
    chain, step = [], (0, "collect", "retriever")
    while step[0] == 0:
        chain.append(step[1:])
        step = next_step(cfg, *step)
    assert chain == [
        ("collect", "retriever"), ("train", "retriever"), ("publish", "retriever"),
        ("collect", "policy"), ("train", "policy"), ("publish", "policy"),
    ]  # fmt: skip
    assert step == (1, "collect", "retriever")
    with pytest.raises(ValueError):  # a reweighted step name is not part of a fresh plan
        next_step(cfg, 0, "train", "round")


@pytest.mark.parametrize("algo", ["search-r1", "retriever-only", "alt-pr", "joint"])
def test_fresh_needs_a_retriever_step_before_the_policy_step(algo):
    with pytest.raises(ValidationError, match="fresh"):
        AlgoConfig(algo=algo, policy_rollouts="fresh")


def test_fresh_is_accepted_for_bridge_and_alt_rp_but_not_live():
    assert AlgoConfig(algo="alt-rp", policy_rollouts="fresh").policy_rollouts == "fresh"
    fresh = AlgoConfig(algo="bridge", policy_rollouts="fresh")
    RunConfig(run_id="r", dataset="hotpotqa", rounds=1, questions_per_round=2, algo=fresh)
    with pytest.raises(ValidationError, match="live"):
        RunConfig(run_id="r", dataset="hotpotqa", rounds=1, questions_per_round=2, source="live", algo=fresh)


def record(trajectory_id: str, item: str, g: int) -> TrajectoryRecord:
    return TrajectoryRecord(
        id=trajectory_id, item_id=item, group_index=g, question="q?", golden_answers=["a"], prompt="p",
        prompt_ids=[1], turns=[], answer=None, policy_version="base", retriever_version="base", reward=0.0,
        created_at=0.0, run_id=rollout_tag("run", 0, "fresh"),
    )  # fmt: skip


ITEMS = [{"id": "q1"}, {"id": "q2"}]


def test_complete_groups_keeps_the_newest_rollout_of_each_slot():
    entries = [(f"{n}-0", record(f"t{n}", item, g)) for n, (item, g) in
               enumerate([("q1", 0), ("q1", 1), ("q2", 0), ("q2", 1), ("q1", 0)], start=1)]  # fmt: skip
    kept, leftover = complete_groups(entries, ITEMS, group_size=2)
    assert sorted(rec.id for _, rec in kept) == ["t2", "t3", "t4", "t5"]  # t5 re-did (q1, 0)
    assert leftover == ["1-0"]
    # entry ids compare as stream ids, not strings ("10-0" is newer than "9-0")
    kept, _ = complete_groups([("10-0", record("new", "q1", 0)), ("9-0", record("old", "q1", 0))], ITEMS[:1], 1)
    assert [rec.id for _, rec in kept] == ["new"]


def test_complete_groups_gives_nothing_for_a_partial_collection():
    entries = [("1-0", record("t1", "q1", 0)), ("2-0", record("t2", "q1", 1)), ("3-0", record("t3", "q2", 0))]
    kept, leftover = complete_groups(entries, ITEMS, group_size=2)
    assert kept == [] and leftover == ["1-0", "2-0", "3-0"]


def test_rollout_tags_of_a_round_differ_by_collection():
    assert rollout_tag("run", 2) == "run/r2"
    assert rollout_tag("run", 2, "fresh") == "run/r2-fresh"


def test_a_retried_collection_recovers_its_entries_and_leaves_the_rounds_other_collection_pending():
    """Real Redis: what a dead attempt left (pending or never read) is recovered; the first collection's
    entries stay pending while the fresh one is taken; a superseded entry of the tag is acknowledged."""
    import os
    import uuid

    import redis

    from services.trainer.rollout import ensure_group, group_name, take_from_stream

    r = redis.Redis.from_url(os.environ.get("BRIDGE_TEST_REDIS_URL", "redis://127.0.0.1:6379/0"), decode_responses=True)
    stream, run = f"test:trajectories:{uuid.uuid4().hex}", "run"
    try:
        ensure_group(r, stream, run)

        def add(trajectory_id: str, tag: str, item: str, g: int) -> str:
            rec = record(trajectory_id, item, g).model_copy(update={"run_id": tag})
            return r.xadd(stream, {"data": rec.model_dump_json()})

        first, fresh = rollout_tag(run, 0), rollout_tag(run, 0, "fresh")
        add("a1", first, "q1", 0)
        add("other", "another-run/r0", "q1", 0)
        assert [rec.id for _, rec in take_from_stream(r, stream, run, first, expected={"a1"})] == ["a1"]
        add("f1", fresh, "q1", 0)  # read by an attempt that died: pending
        r.xreadgroup(group_name(run), "worker", {stream: ">"}, count=1)
        add("f2", fresh, "q1", 1)  # written after it died: never read
        recovered = take_from_stream(r, stream, run, fresh, expected=None)
        assert sorted(rec.id for _, rec in recovered) == ["f1", "f2"]
        pending = {e["message_id"] for e in r.xpending_range(stream, group_name(run), "-", "+", 10)}
        assert len(pending) == 3  # a1, f1, f2: nothing acknowledged before the round is published
        take_from_stream(r, stream, run, fresh, expected={"f2"}, timeout_s=0)  # f1 was superseded
        assert r.xpending(stream, group_name(run))["pending"] == 2
    finally:
        r.delete(stream)


def test_live_rounds_take_the_freshest_trajectories_and_drop_the_stale():
    """Real Redis: traffic outpaces the trainer, so a live round takes the newest policy version's rewarded
    entries first (newest first within a version), leaves the fresh rest pending, and acknowledges what is stale
    or unrewarded."""
    import os
    import uuid

    import redis

    from services.trainer.rollout import ensure_group, group_name, take_live

    r = redis.Redis.from_url(os.environ.get("BRIDGE_TEST_REDIS_URL", "redis://127.0.0.1:6379/0"), decode_responses=True)
    stream, run = f"test:feedback:{uuid.uuid4().hex}", "run"
    try:
        ensure_group(r, stream, run)

        def add(trajectory_id: str, version: str, reward: float | None = 1.0) -> str:
            rec = record(trajectory_id, "q1", 0).model_copy(update={"policy_version": version, "reward": reward})
            return r.xadd(stream, {"data": rec.model_dump_json()})

        for n in range(4):
            add(f"old{n}", "v0")  # two versions behind: stale once v2 is the newest fresh one
        for n in range(3):
            add(f"v1-{n}", "v1")
        add("v2-0", "v2")
        add("v2-unrewarded", "v2", reward=None)
        add("v2-1", "v2")
        taken, dropped, *_ = take_live(r, stream, run, want=3, fresh_versions=["v1", "v2"])
        assert [rec.id for _, rec in taken] == ["v1-2", "v2-0", "v2-1"]  # arrival order among the chosen
        assert dropped == 5  # four of v0 and the unrewarded one, acknowledged
        assert r.xpending(stream, group_name(run))["pending"] == 5  # the three taken and v1-0, v1-1 for later
        taken, dropped, *_ = take_live(r, stream, run, want=3, fresh_versions=["v1", "v2"])
        assert [rec.id for _, rec in taken] == ["v1-2", "v2-0", "v2-1"] and dropped == 0  # a retry takes the same
    finally:
        r.delete(stream)


def test_a_live_round_takes_each_trajectory_once():
    """Real Redis: two feedback entries for one trajectory (a writer other than the policy service, which announces
    one) are one training sample; the later one is acknowledged and dropped."""
    import os
    import uuid

    import redis

    from services.trainer.rollout import ensure_group, group_name, take_live

    r = redis.Redis.from_url(os.environ.get("BRIDGE_TEST_REDIS_URL", "redis://127.0.0.1:6379/0"), decode_responses=True)
    stream, run = f"test:feedback:{uuid.uuid4().hex}", "run"
    try:
        ensure_group(r, stream, run)
        for trajectory_id, reward in (("t1", 1.0), ("t2", 0.0), ("t1", 0.0)):
            rec = record(trajectory_id, "q1", 0).model_copy(update={"policy_version": "v1", "reward": reward})
            r.xadd(stream, {"data": rec.model_dump_json()})
        taken, dropped, *_ = take_live(r, stream, run, want=3, fresh_versions=["v1"])
        assert sorted(rec.id for _, rec in taken) == ["t1", "t2"] and dropped == 1
        assert r.xpending(stream, group_name(run))["pending"] == 2
    finally:
        r.delete(stream)


def test_a_run_whose_group_redis_lost_reads_again_instead_of_failing_with_nogroup():
    """Real Redis restarted without persistence (the stream and its groups gone): the next read recreates the
    run's group and goes on; a dataset round's missing rollouts are then asked for again (collect)."""
    import os
    import uuid

    import redis

    from services.trainer.rollout import ensure_group, take_from_stream, take_live

    r = redis.Redis.from_url(os.environ.get("BRIDGE_TEST_REDIS_URL", "redis://127.0.0.1:6379/0"), decode_responses=True)
    stream, run = f"test:trajectories:{uuid.uuid4().hex}", "run"
    try:
        ensure_group(r, stream, run)
        r.delete(stream)  # what a restart without persistence leaves
        assert take_from_stream(r, stream, run, rollout_tag(run, 0), expected=None) == []
        r.delete(stream)
        assert take_live(r, stream, run, want=1, fresh_versions=["v1"]).entries == []
    finally:
        r.delete(stream)


def test_pending_entries_trimmed_from_the_stream_are_reported_not_skipped():
    """Real Redis: entries a round read and left pending, then trimmed (the stream's hard cap), are counted as lost
    by a live round, and a dataset round missing them fails saying they were trimmed, not that they never came."""
    import os
    import uuid

    import pytest
    import redis

    from services.trainer.rollout import EntriesTrimmed, ensure_group, group_name, take_from_stream, take_live

    r = redis.Redis.from_url(os.environ.get("BRIDGE_TEST_REDIS_URL", "redis://127.0.0.1:6379/0"), decode_responses=True)
    stream, run = f"test:trajectories:{uuid.uuid4().hex}", "run"
    try:
        ensure_group(r, stream, run)
        tag = rollout_tag(run, 0)
        for n in range(3):
            rec = record(f"a{n}", "q1", n).model_copy(update={"run_id": tag, "policy_version": "v1", "reward": 1.0})
            r.xadd(stream, {"data": rec.model_dump_json()})
        r.xreadgroup(group_name(run), "worker", {stream: ">"})  # a round read them and died
        r.xtrim(stream, maxlen=1, approximate=False)
        with pytest.raises(EntriesTrimmed, match="2 of the run's pending entries were trimmed"):
            take_from_stream(r, stream, run, tag, expected={"a0", "a1", "a2"}, timeout_s=0)
        r.xreadgroup(group_name(run), "worker", {stream: ">"})
        r.xtrim(stream, maxlen=0, approximate=False)
        assert take_live(r, stream, run, want=3, fresh_versions=["v1"]).lost == 1
    finally:
        r.delete(stream)
