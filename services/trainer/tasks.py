"""Thin Celery tasks: a round is collect -> train -> publish, and publish enqueues the next round.
Payloads are a run id and a round number; the work lives in `work.py`."""

from __future__ import annotations

from celery import shared_task

from services.trainer import work
from services.trainer.settings import TrainerSettings


def _settings() -> TrainerSettings:
    return TrainerSettings()


@shared_task(name="trainer.round.collect", bind=True)
def collect(self, run_id: str, round_index: int) -> None:
    try:
        settings = _settings()
        outcome = work.collect(settings, run_id, round_index)
        if outcome == "ready":
            train.delay(run_id, round_index)
        elif outcome == "wait":  # live: look again later, without holding a worker
            collect.apply_async((run_id, round_index), countdown=settings.live_poll_s)
    except Exception as exc:
        work.mark_failed(_settings(), run_id, f"collect round {round_index}: {exc!r}")
        raise


@shared_task(name="trainer.round.train", bind=True)
def train(self, run_id: str, round_index: int) -> None:
    try:
        if work.train(_settings(), run_id, round_index):
            publish.delay(run_id, round_index)
    except Exception as exc:
        work.mark_failed(_settings(), run_id, f"train round {round_index}: {exc!r}")
        raise


@shared_task(name="trainer.round.publish", bind=True)
def publish(self, run_id: str, round_index: int) -> None:
    try:
        if work.publish(_settings(), run_id, round_index):
            collect.delay(run_id, round_index + 1)
    except Exception as exc:
        work.mark_failed(_settings(), run_id, f"publish round {round_index}: {exc!r}")
        raise
