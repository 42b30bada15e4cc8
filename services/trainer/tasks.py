"""Thin Celery tasks: a round is collect -> train -> publish (twice, for the retriever and then the policy,
with `--policy-rollouts fresh`; see `plan.py`), and the round's last publish enqueues the next round.
Payloads are a run id, a round number and a phase name; the work lives in `collect.py`, `train.py` and
`publish.py` (one module per step; their files in `round_files.py`).

A step that fails transiently (`retry.AUTORETRY_FOR`) is retried by Celery (`autoretry_for`, `retry_backoff`,
`retry_jitter`; the numbers from TrainerSettings through `task_annotations`, see `retry.retry_annotations`), up to
`BRIDGE_TRAINER_RETRY_MAX` times, which is safe because every step is idempotent (keyed by run, round and phase);
only then, or at once for any other error, is the run marked failed with the reason (`RoundStep.on_failure`)."""

from __future__ import annotations

import inspect
import logging

from celery import Task, shared_task
from celery.exceptions import Reject

from services.trainer import collect as collect_step
from services.trainer import plan
from services.trainer import publish as publish_step
from services.trainer import train as train_step
from services.trainer.retry import AUTORETRY_FOR, DONT_AUTORETRY_FOR, is_transient
from services.trainer.round_files import mark_failed, redis_client
from services.trainer.run_state import RunState
from services.trainer.settings import TrainerSettings
from services.trainer.trackers import check_trackers

log = logging.getLogger(__name__)


def _settings() -> TrainerSettings:
    return TrainerSettings()


def _algo(settings: TrainerSettings, run_id: str):
    return RunState.load(settings.runs_dir, run_id).config.algo


# How long the record that a step was enqueued is kept: longer than any round.
CHAIN_MARK_TTL_S = 7 * 24 * 3600


def _then(settings: TrainerSettings, run_id: str, round_index: int, step: plan.Step, phase: plan.Phase) -> None:
    """Enqueue the step after this one, once per run: a redelivered message (acks_late, a worker lost after its
    step was done) finds the mark and starts no second chain of rounds. The mark is set before the send, so a
    worker that dies between the two leaves the run waiting, which `bridge-rl train --resume` restarts, and never
    running twice."""
    state = RunState.load(settings.runs_dir, run_id)
    next_round, next_step, next_phase = plan.next_step(state.config.algo, round_index, step, phase)
    mark = f"bridge:trainer:enqueued:{run_id}:{state.chain_id}:{next_round}:{next_step}:{next_phase}"
    if not redis_client(settings).set(mark, "1", nx=True, ex=CHAIN_MARK_TTL_S):
        log.info("run %s: %s of round %d (%s) was enqueued already", run_id, next_step, next_round, next_phase)
        return
    {"collect": collect, "train": train, "publish": publish}[next_step].delay(run_id, next_round, next_phase)


class RoundStep(Task):
    """A round step's task: Celery retries what `retry.is_transient` calls transient; a failure it does not retry
    (permanent, or transient past the retries) marks the run failed with the step and the reason."""

    autoretry_for = AUTORETRY_FOR
    dont_autoretry_for = DONT_AUTORETRY_FOR

    def __call__(self, *args, **kwargs):
        """Count this message's deliveries (per retry: a retry is a new message under the same task id); past
        `max_redeliveries` the worker running it was lost each time, and the run fails instead of looping."""
        if self.request.id is None:  # called in-process (a test, `.run`): no message
            return super().__call__(*args, **kwargs)
        settings = _settings()
        key = f"bridge:trainer:deliveries:{self.request.id}:{self.request.retries}"
        r = redis_client(settings)
        deliveries = r.incr(key)
        r.expire(key, CHAIN_MARK_TTL_S)
        if deliveries > settings.max_redeliveries + 1:
            run_id, what = self._what(args, kwargs)
            reason = (f"{what}: delivered {deliveries} times, its worker lost each time (killed for memory or "
                      "time?); BRIDGE_TRAINER_MAX_REDELIVERIES bounds it")  # fmt: skip
            mark_failed(settings, run_id, reason)
            log.error("run %s: %s failed after %d deliveries", run_id, what, deliveries)
            return None
        return super().__call__(*args, **kwargs)

    def _what(self, args: tuple, kwargs: dict) -> tuple[str, str]:
        """(run id, "publish round 0 (round)") of this call."""
        call = inspect.signature(self.run).bind(*args, **kwargs)
        call.apply_defaults()
        run_id, round_index, phase = (call.arguments[k] for k in ("run_id", "round_index", "phase"))
        step = self.name.rsplit(".", 1)[-1]
        return run_id, f"{step} round {round_index}" + (f" ({phase})" if phase else "")

    def on_failure(self, exc, task_id, args, kwargs, einfo) -> None:
        run_id, what = self._what(args, kwargs)
        if is_transient(exc):
            what = f"{what}, transient, after {self.request.retries} retries"
        mark_failed(_settings(), run_id, f"{what}: {exc!r}")

    def retry(self, *args, **kwargs):
        try:
            return super().retry(*args, **kwargs)
        except Reject as reject:  # the retry could not be enqueued (the broker is down as well): no on_failure
            run_id, what = self._what(self.request.args, self.request.kwargs)
            what = f"{what}, whose retry could not be enqueued ({reject.reason!r}), transient, after "
            mark_failed(_settings(), run_id, f"{what}{self.request.retries} retries: {kwargs.get('exc')!r}")
            raise


@shared_task(name="trainer.round.collect", bind=True, base=RoundStep)
def collect(self, run_id: str, round_index: int, phase: plan.Phase | None = None) -> None:
    """`phase=None` (how a run is started or resumed): the plan's first phase, once the run's trackers are found
    importable on this worker (else the run fails now, with the one-line reason, not at its first publish)."""
    settings = _settings()
    if phase is None:
        check_trackers(RunState.load(settings.runs_dir, run_id).config.report_to)
    phase = phase or plan.first_phase(_algo(settings, run_id))
    outcome = collect_step.collect(settings, run_id, round_index, phase)
    if outcome == "ready":
        _then(settings, run_id, round_index, "collect", phase)
    elif outcome == "wait":  # live: look again later, without holding a worker
        collect.apply_async((run_id, round_index, phase), countdown=settings.live_poll_s)


@shared_task(name="trainer.round.train", bind=True, base=RoundStep)
def train(self, run_id: str, round_index: int, phase: plan.Phase = "round") -> None:
    settings = _settings()
    if train_step.train(settings, run_id, round_index, phase):
        _then(settings, run_id, round_index, "train", phase)


@shared_task(name="trainer.round.publish", bind=True, base=RoundStep)
def publish(self, run_id: str, round_index: int, phase: plan.Phase = "round") -> None:
    settings = _settings()
    if publish_step.publish(settings, run_id, round_index, phase):
        _then(settings, run_id, round_index, "publish", phase)
