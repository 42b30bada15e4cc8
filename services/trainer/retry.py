"""Which failures of a round step are transient (worth a delayed retry of the whole, idempotent step) and how long
to wait before the next attempt. Everything else is permanent: the run fails at once with the reason."""

from __future__ import annotations

import random

import httpx
import redis

from services.common.clients.base import ServiceError

# An upstream that is there but cannot answer right now (a checkpoint swap, a restart behind a proxy).
TRANSIENT_STATUSES = frozenset({502, 503, 504})
# Transport errors that are the caller's own mistake: a retry fails the same way.
_PERMANENT_TRANSPORT = (httpx.UnsupportedProtocol, httpx.LocalProtocolError)
# A wrong password fails the same way every time, though redis-py files it under ConnectionError.
_PERMANENT_REDIS = (redis.exceptions.AuthenticationError, redis.exceptions.AuthorizationError)


def is_transient(exc: BaseException) -> bool:
    """A 502/503/504 from the policy or retriever, a refused/dropped connection or timeout on the way to them,
    or a Redis connection error or timeout. A 4xx, a 500, a ValueError or a missing file is not."""
    if isinstance(exc, ServiceError):
        return exc.status_code in TRANSIENT_STATUSES
    if isinstance(exc, httpx.TransportError):
        return not isinstance(exc, _PERMANENT_TRANSPORT)
    if isinstance(exc, (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError)):
        return not isinstance(exc, _PERMANENT_REDIS)
    return False


def backoff_s(retries: int, *, base_s: float, max_s: float, jitter: bool, rng: random.Random | None = None) -> float:
    """Seconds before retry number `retries + 1`: base * 2**retries, capped at max_s; with `jitter`, drawn uniformly
    from [0, that] ("full jitter", as Celery's retry_jitter), so workers that failed together do not return
    together."""
    ceiling = min(max_s, base_s * 2.0**retries)
    return (rng or random).uniform(0.0, ceiling) if jitter else ceiling
