"""Which failures of a round step are transient (worth a delayed retry of the whole, idempotent step), as Celery's
`autoretry_for` less `dont_autoretry_for`, and the retry options of the round-step tasks (`task_annotations`, so
the numbers come from TrainerSettings). Everything else is permanent: the run fails at once with the reason."""

from __future__ import annotations

import httpx
import redis

from services.common.clients.base import ServiceUnavailableError
from services.trainer.settings import TrainerSettings

ROUND_STEPS = ("trainer.round.collect", "trainer.round.train", "trainer.round.publish")
# A 502/503/504 from the policy or retriever, a refused/dropped connection or timeout on the way to them, or a Redis
# connection error or timeout.
AUTORETRY_FOR = (ServiceUnavailableError, httpx.TransportError, redis.exceptions.ConnectionError,
                 redis.exceptions.TimeoutError)  # fmt: skip
# Transport errors that are the caller's own mistake (a retry fails the same way), and a wrong password, which
# redis-py files under ConnectionError.
DONT_AUTORETRY_FOR = (httpx.UnsupportedProtocol, httpx.LocalProtocolError, redis.exceptions.AuthenticationError,
                      redis.exceptions.AuthorizationError)  # fmt: skip


def is_transient(exc: BaseException) -> bool:
    """Whether Celery's autoretry retries `exc` (the test it applies). A 4xx, a 500, a ValueError or a missing file
    is not transient."""
    return isinstance(exc, AUTORETRY_FOR) and not isinstance(exc, DONT_AUTORETRY_FOR)


def retry_annotations(settings: TrainerSettings) -> dict[str, dict]:
    """`task_annotations` of the round steps: up to `retry_max` retries, the n-th after base * 2**n seconds capped
    at the maximum, with `retry_jitter` drawn uniformly from [0, that] ("full jitter") so that workers that failed
    together do not return together."""
    options = {"max_retries": settings.retry_max, "retry_backoff": settings.retry_backoff_s,
               "retry_backoff_max": settings.retry_backoff_max_s, "retry_jitter": settings.retry_jitter}  # fmt: skip
    return {name: options for name in ROUND_STEPS}
