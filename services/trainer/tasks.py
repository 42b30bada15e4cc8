"""Thin Celery tasks: a round is collect -> train -> publish (twice, for the retriever and then the policy,
with `--policy-rollouts fresh`; see `plan.py`), and the round's last publish enqueues the next round.
Payloads are a run id, a round number and a phase name; the work lives in `collect.py`, `train.py` and
`publish.py` (one module per step; their files in `round_files.py`).

A step that fails transiently (see `retry.is_transient`) is retried with exponential backoff and jitter, up to
`BRIDGE_TRAINER_RETRY_MAX` times, which is safe because every step is idempotent (keyed by run, round and phase);
only then, or at once for any other error, is the run marked failed with the reason."""

from __future__ import annotations

import logging

from celery import Task, shared_task
from celery.exceptions import Reject

from services.trainer import collect as collect_step
from services.trainer import plan
from services.trainer import publish as publish_step
from services.trainer import train as train_step
from services.trainer.retry import backoff_s, is_transient
from services.trainer.round_files import mark_failed
from services.trainer.run_state import RunState
from services.trainer.settings import TrainerSettings

log = logging.getLogger(__name__)


def _settings() -> TrainerSettings:
    return TrainerSettings()


def _algo(settings: TrainerSettings, run_id: str):
    return RunState.load(settings.runs_dir, run_id).config.algo


def _then(settings: TrainerSettings, run_id: str, round_index: int, step: plan.Step, phase: plan.Phase) -> None:
    next_round, next_step, next_phase = plan.next_step(_algo(settings, run_id), round_index, step, phase)
    {"collect": collect, "train": train, "publish": publish}[next_step].delay(run_id, next_round, next_phase)


def _retry_or_fail(task: Task, run_id: str, what: str, exc: Exception) -> None:
    """Raises celery's Retry (the same step again, later) for a transient error with retries left; otherwise marks
    the run failed with the reason and returns, and the caller re-raises `exc`."""
    settings = _settings()
    retries = task.request.retries
    if is_transient(exc):
        if retries < settings.retry_max:
            countdown = backoff_s(retries, base_s=settings.retry_backoff_s, max_s=settings.retry_backoff_max_s,
                                  jitter=settings.retry_jitter)  # fmt: skip
            log.warning("%s: transient %r; retry %d of %d in %.2fs", what, exc, retries + 1, settings.retry_max,
                        countdown)  # fmt: skip
            try:
                raise task.retry(exc=exc, countdown=countdown, max_retries=settings.retry_max)
            except Reject as reject:  # the retry could not be enqueued (the broker is down as well)
                what = f"{what}, whose retry could not be enqueued ({reject.reason!r})"
        what = f"{what}, transient, after {retries} retries"
    mark_failed(settings, run_id, f"{what}: {exc!r}")


@shared_task(name="trainer.round.collect", bind=True)
def collect(self, run_id: str, round_index: int, phase: plan.Phase | None = None) -> None:
    """`phase=None` (how a run is started or resumed): the plan's first phase."""
    try:
        settings = _settings()
        phase = phase or plan.first_phase(_algo(settings, run_id))
        outcome = collect_step.collect(settings, run_id, round_index, phase)
        if outcome == "ready":
            _then(settings, run_id, round_index, "collect", phase)
        elif outcome == "wait":  # live: look again later, without holding a worker
            collect.apply_async((run_id, round_index, phase), countdown=settings.live_poll_s)
    except Exception as exc:
        _retry_or_fail(self, run_id, f"collect round {round_index} ({phase})", exc)
        raise


@shared_task(name="trainer.round.train", bind=True)
def train(self, run_id: str, round_index: int, phase: plan.Phase = "round") -> None:
    try:
        settings = _settings()
        if train_step.train(settings, run_id, round_index, phase):
            _then(settings, run_id, round_index, "train", phase)
    except Exception as exc:
        _retry_or_fail(self, run_id, f"train round {round_index} ({phase})", exc)
        raise


@shared_task(name="trainer.round.publish", bind=True)
def publish(self, run_id: str, round_index: int, phase: plan.Phase = "round") -> None:
    try:
        settings = _settings()
        if publish_step.publish(settings, run_id, round_index, phase):
            _then(settings, run_id, round_index, "publish", phase)
    except Exception as exc:
        _retry_or_fail(self, run_id, f"publish round {round_index} ({phase})", exc)
        raise
