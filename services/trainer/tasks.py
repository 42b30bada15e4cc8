"""Thin Celery tasks: a round is collect -> train -> publish (twice, for the retriever and then the policy,
with `--policy-rollouts fresh`; see `plan.py`), and the round's last publish enqueues the next round.
Payloads are a run id, a round number and a phase name; the work lives in `work.py`."""

from __future__ import annotations

from celery import shared_task

from services.trainer import plan, work
from services.trainer.run_state import RunState
from services.trainer.settings import TrainerSettings


def _settings() -> TrainerSettings:
    return TrainerSettings()


def _algo(settings: TrainerSettings, run_id: str):
    return RunState.load(settings.runs_dir, run_id).config.algo


def _then(settings: TrainerSettings, run_id: str, round_index: int, step: plan.Step, phase: plan.Phase) -> None:
    next_round, next_step, next_phase = plan.next_step(_algo(settings, run_id), round_index, step, phase)
    {"collect": collect, "train": train, "publish": publish}[next_step].delay(run_id, next_round, next_phase)


@shared_task(name="trainer.round.collect", bind=True)
def collect(self, run_id: str, round_index: int, phase: plan.Phase | None = None) -> None:
    """`phase=None` (how a run is started or resumed): the plan's first phase."""
    try:
        settings = _settings()
        phase = phase or plan.first_phase(_algo(settings, run_id))
        outcome = work.collect(settings, run_id, round_index, phase)
        if outcome == "ready":
            _then(settings, run_id, round_index, "collect", phase)
        elif outcome == "wait":  # live: look again later, without holding a worker
            collect.apply_async((run_id, round_index, phase), countdown=settings.live_poll_s)
    except Exception as exc:
        work.mark_failed(_settings(), run_id, f"collect round {round_index} ({phase}): {exc!r}")
        raise


@shared_task(name="trainer.round.train", bind=True)
def train(self, run_id: str, round_index: int, phase: plan.Phase = "round") -> None:
    try:
        settings = _settings()
        if work.train(settings, run_id, round_index, phase):
            _then(settings, run_id, round_index, "train", phase)
    except Exception as exc:
        work.mark_failed(_settings(), run_id, f"train round {round_index} ({phase}): {exc!r}")
        raise


@shared_task(name="trainer.round.publish", bind=True)
def publish(self, run_id: str, round_index: int, phase: plan.Phase = "round") -> None:
    try:
        settings = _settings()
        if work.publish(settings, run_id, round_index, phase):
            _then(settings, run_id, round_index, "publish", phase)
    except Exception as exc:
        work.mark_failed(_settings(), run_id, f"publish round {round_index} ({phase}): {exc!r}")
        raise
