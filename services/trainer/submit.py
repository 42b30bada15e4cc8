"""Hand a run to the Celery workers and follow it from a client process (CLI, demo, experiments)."""

from __future__ import annotations

import time
from collections.abc import Callable

from services.trainer.celery_app import make_celery
from services.trainer.run_state import RunState
from services.trainer.settings import TrainerSettings


def enqueue(settings: TrainerSettings, run_id: str, round_index: int) -> None:
    """The first step of `round_index`; each task enqueues the next, so this is the only send a run needs."""
    make_celery(settings).send_task("trainer.round.collect", args=[run_id, round_index])


def follow(settings: TrainerSettings, run_id: str, on_progress: Callable[[int], None] = lambda _: None,
           poll_s: float = 1.0) -> RunState:  # fmt: skip
    """Polls the run's state file (the workers' record, so it survives a worker restart) until the run is
    done or failed; `on_progress` gets the number of published rounds at every look."""
    while True:
        state = RunState.load(settings.runs_dir, run_id)
        on_progress(state.next_round)
        if state.status != "running":
            return state
        time.sleep(poll_s)
