"""Which round-step failures are retried (transient) and which fail the run at once, and the backoff schedule."""

from __future__ import annotations

import random
import socket

import httpx
import pytest
import redis
from pydantic import ValidationError

from services.common.clients.base import ServiceError, _raise_for
from services.trainer.retry import backoff_s, is_transient
from services.trainer.settings import TrainerSettings


def _service_error(status: int) -> ServiceError:
    """The error the real clients raise for a response with this status."""
    response = httpx.Response(status, json={"detail": f"status {status}"}, request=httpx.Request("GET", "http://x/"))
    with pytest.raises(ServiceError) as info:
        _raise_for(response)
    return info.value


@pytest.mark.parametrize("status", [502, 503, 504])
def test_gateway_and_unavailable_statuses_are_transient(status):
    assert is_transient(_service_error(status))


@pytest.mark.parametrize("status", [400, 401, 403, 404, 409, 413, 422, 500])
def test_caller_mistakes_and_server_bugs_are_permanent(status):
    assert not is_transient(_service_error(status))


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]  # closed again when the block ends: nothing listens there


def test_a_refused_connection_is_transient():
    with pytest.raises(httpx.TransportError) as info:
        httpx.get(f"http://127.0.0.1:{_closed_port()}/healthz", timeout=2)
    assert is_transient(info.value)


def test_a_redis_that_does_not_answer_is_transient():
    client = redis.Redis(host="127.0.0.1", port=_closed_port(), socket_connect_timeout=1)
    with pytest.raises(redis.exceptions.ConnectionError) as info:
        client.ping()
    assert is_transient(info.value)


@pytest.mark.parametrize(
    "exc",
    [
        httpx.ReadTimeout("read timed out"),
        httpx.RemoteProtocolError("server disconnected without sending a response"),
        redis.exceptions.TimeoutError("Timeout reading from socket"),
        redis.exceptions.BusyLoadingError("Redis is loading the dataset in memory"),
    ],
)
def test_timeouts_and_dropped_connections_are_transient(exc):
    assert is_transient(exc)


@pytest.mark.parametrize(
    "exc",
    [
        ValueError("policy_rollouts='fresh' needs questions"),
        FileNotFoundError("no hotpotqa.jsonl in qa_dir"),
        RuntimeError("fresh rollouts before the round's retriever is published"),
        KeyError("retriever"),
        httpx.UnsupportedProtocol("Request URL is missing an 'http://' or 'https://' protocol."),
        redis.exceptions.AuthenticationError("invalid username-password pair"),
        redis.exceptions.ResponseError("NOGROUP No such key"),
    ],
)
def test_everything_else_is_permanent(exc):
    assert not is_transient(exc)


def test_backoff_doubles_up_to_the_cap():
    waits = [backoff_s(n, base_s=0.5, max_s=3.0, jitter=False) for n in range(6)]
    assert waits == [0.5, 1.0, 2.0, 3.0, 3.0, 3.0]


def test_jittered_backoff_stays_within_zero_and_the_unjittered_wait():
    rng = random.Random(0)
    for n in range(8):
        ceiling = backoff_s(n, base_s=1.0, max_s=20.0, jitter=False)
        waits = [backoff_s(n, base_s=1.0, max_s=20.0, jitter=True, rng=rng) for _ in range(200)]
        assert all(0.0 <= w <= ceiling for w in waits)
        assert len(set(waits)) > 100  # drawn, not fixed


def test_retry_settings_come_from_the_environment(monkeypatch):
    monkeypatch.setenv("BRIDGE_TRAINER_RETRY_MAX", "3")
    monkeypatch.setenv("BRIDGE_TRAINER_RETRY_BACKOFF_S", "0.25")
    monkeypatch.setenv("BRIDGE_TRAINER_RETRY_BACKOFF_MAX_S", "4")
    monkeypatch.setenv("BRIDGE_TRAINER_RETRY_JITTER", "false")
    settings = TrainerSettings()
    assert (settings.retry_max, settings.retry_backoff_s, settings.retry_backoff_max_s) == (3, 0.25, 4.0)
    assert settings.retry_jitter is False


def test_a_cap_below_the_first_wait_is_refused_at_start_up():
    with pytest.raises(ValidationError, match="retry_backoff_max_s"):
        TrainerSettings(retry_backoff_s=10, retry_backoff_max_s=1)
