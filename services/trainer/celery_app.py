"""The Celery app: broker and result backend from REDIS_URL; built by a factory, never at import time
(`celery -A services.trainer.celery_app` asks for `app`, which is built then, from the environment)."""

from __future__ import annotations

from celery import Celery

from services.trainer.retry import retry_annotations
from services.trainer.settings import TrainerSettings


def make_celery(settings: TrainerSettings | None = None) -> Celery:
    settings = settings or TrainerSettings()
    app = Celery("bridge-trainer", broker=settings.resolved_redis_url, backend=settings.resolved_redis_url,
                 include=["services.trainer.tasks"])  # fmt: skip
    app.conf.update(
        task_acks_late=True,  # a task a dead worker held goes back to the queue
        task_reject_on_worker_lost=True,
        worker_prefetch_multiplier=1,
        task_time_limit=settings.task_time_limit_s,
        task_soft_time_limit=settings.task_time_limit_s - 30,
        broker_transport_options={"visibility_timeout": settings.task_time_limit_s + 600},
        broker_connection_retry_on_startup=True,
        task_serializer="json",
        accept_content=["json"],
        result_expires=24 * 3600,
        worker_hijack_root_logger=False,
        task_default_queue=settings.queue,
        task_annotations=retry_annotations(settings),  # the round steps' retries (retry.py)
    )
    return app


def __getattr__(name: str) -> Celery:
    """PEP 562: the module's `app` is made when something asks for it, not when the module is imported."""
    if name in ("app", "celery"):
        return make_celery()
    raise AttributeError(name)
