"""The collect step: a round's trajectories, from rollouts on the run's questions or from served traffic."""

from __future__ import annotations

import json
import logging
import time

from services.common.checkpoints import write_json_atomic
from services.common.clients.policy import PolicyClient
from services.trainer import plan
from services.trainer.plan import Phase
from services.trainer.rollback import watch
from services.trainer.rollout import (
    check_versions,
    complete_groups,
    group_name,
    request_rollouts,
    rollout_tag,
    round_items,
    save_round_rollouts,
    take_from_stream,
    take_live,
)
from services.trainer.round_files import (
    PUBLISHED_RETRIEVER,
    redis_client,
    rollouts_file,
    round_dir,
    run_questions,
    source_stream,
)
from services.trainer.run_state import RunState
from services.trainer.settings import TrainerSettings

log = logging.getLogger(__name__)


def collect(settings: TrainerSettings, run_id: str, round_index: int, phase: Phase = "round") -> str:
    """Trajectories for the round: "ready", "skip" (already published), "wait" (live: not enough yet) or
    "paused" (live: the newest version served worse than the one before and was rolled back).

    The policy phase of a fresh round asks the same questions again, after its retriever went live."""
    state = RunState.load(settings.runs_dir, run_id)
    if state.next_round > round_index:
        return "skip"
    folder = round_dir(settings, run_id, round_index)
    name = plan.collection(phase)
    out = folder / rollouts_file(name)
    if out.exists():
        return "ready"
    config = state.config
    if config.source == "live":
        return collect_live(settings, state, round_index, out)
    versions = run_versions(state)
    if name:
        if not (folder / PUBLISHED_RETRIEVER).exists():
            raise RuntimeError(f"round {round_index}: fresh rollouts before the round's retriever is published")
        items = json.loads((folder / "items.json").read_text())
        versions = (versions[0], json.loads((folder / PUBLISHED_RETRIEVER).read_text())["version"])
    else:
        items = round_items(config, run_questions(settings, config), round_index)
        write_json_atomic(folder / "items.json", items)
    r = redis_client(settings)
    tag = rollout_tag(run_id, round_index, name)
    # A retried step first takes what the last attempt left in the stream, and asks again only if that is
    # not a full set of groups (the superseded entries are acknowledged as the new ones are read).
    recovered = take_from_stream(r, settings.trajectory_stream, run_id, tag, expected=None)
    entries, leftover = complete_groups(recovered, items, config.algo.group_size)
    if entries:
        if leftover:
            r.xack(settings.trajectory_stream, group_name(run_id), *leftover)
    else:
        write_json_atomic(folder / f"requested-{name or 'first'}.json", {"tag": tag, "requested_at": time.time()})
        with PolicyClient(settings.policy_url, settings.services_admin_token(), settings.task_time_limit_s) as client:
            expected = set(request_rollouts(client, config, items, round_index, name, versions))
        entries = take_from_stream(r, settings.trajectory_stream, run_id, tag, expected)
    check_versions([record for _, record in entries], *versions)
    save_round_rollouts(out, entries)
    return "ready"


def run_versions(state: RunState) -> tuple[str, str]:
    """(policy, retriever) versions the run's next rollouts must come from: the last it published, else the ones
    it started from (the trainer's base models)."""
    return (
        state.policy_version or state.initial_policy_version,
        state.retriever_version or state.initial_retriever_version,
    )


def fresh_versions(state: RunState) -> list[str]:
    """The policy versions a live trajectory may come from, oldest first: the newest `max_staleness + 1` of this
    run."""
    undone = {r.round for r in state.rolled_back}
    versions = [state.initial_policy_version] + [
        p.policy_version for p in state.published if p.policy_version and p.round not in undone
    ]
    return list(dict.fromkeys(versions))[-(state.config.max_staleness + 1) :]


def collect_live(settings: TrainerSettings, state: RunState, round_index: int, out) -> str:
    run_id = state.config.run_id
    stream = source_stream(settings, state.config)  # where publish acknowledges them
    r = redis_client(settings)
    entries, dropped, _, feedback = take_live(r, stream, run_id, state.config.live_batch, fresh_versions(state))
    if dropped:
        log.info("run %s: dropped %d stale or unrewarded live trajectories", run_id, dropped)
    if watch(settings, state, feedback) is not None:
        return "paused"  # rolled back to the previous pair: the run waits for --resume
    if len(entries) < state.config.live_batch:
        return "wait"  # they stay pending for this run's group and are re-claimed on the next look
    write_json_atomic(out.with_name("items.json"), [])
    save_round_rollouts(out, entries)
    return "ready"
