"""Which round-step failures are retried (transient) and which fail the run at once, and the backoff schedule, through
Celery's own autoretry of the real task."""

from __future__ import annotations

import socket

import httpx
import pytest
import redis
from celery.exceptions import Retry
from pydantic import ValidationError

from services.common.clients.base import ServiceError, _raise_for
from services.trainer import publish as publish_step
from services.trainer.celery_app import make_celery
from services.trainer.retry import AUTORETRY_FOR, DONT_AUTORETRY_FOR, is_transient
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


@pytest.fixture
def publish_task(monkeypatch):
    """The real `trainer.round.publish` of an app made as the worker makes it, called as a worker calls it, with a
    publish step that raises what the test puts in `failures`; `retried(n)` runs it as retry number n and returns
    Celery's Retry (its `when`: the countdown) or raises what the task raised."""
    failures: list[BaseException] = []

    def failing_publish(*args) -> bool:
        raise failures[0]

    monkeypatch.setattr(publish_step, "publish", failing_publish)

    def make(settings: TrainerSettings):
        app = make_celery(settings)
        app.loader.import_default_modules()  # the app's `include`, as a worker imports it
        task = app.tasks["trainer.round.publish"]

        def retried(n: int, exc: BaseException) -> Retry:
            failures[:] = [exc]
            task.push_request(args=["run", 0, "round"], kwargs={}, retries=n, called_directly=False, is_eager=True)
            try:
                with pytest.raises(Retry) as info:
                    task.run("run", 0, "round")
                return info.value
            finally:
                task.pop_request()

        return task, retried

    return make


def test_the_steps_retry_what_is_transient_and_nothing_else(publish_task):
    task, retried = publish_task(TrainerSettings(metrics_port=0))
    assert task.autoretry_for == AUTORETRY_FOR and task.dont_autoretry_for == DONT_AUTORETRY_FOR
    assert retried(0, _service_error(503)).exc.status_code == 503
    assert isinstance(retried(0, httpx.ConnectError("refused")).exc, httpx.ConnectError)
    for permanent in (_service_error(400), ValueError("no questions"), redis.exceptions.AuthenticationError("pw")):
        with pytest.raises(type(permanent)):  # raised as itself, not as Retry
            retried(0, permanent)


def test_backoff_doubles_up_to_the_cap_then_the_error_is_raised(publish_task):
    settings = TrainerSettings(metrics_port=0, retry_max=5, retry_backoff_s=1, retry_backoff_max_s=3,
                               retry_jitter=False)  # fmt: skip
    _, retried = publish_task(settings)
    assert [retried(n, _service_error(503)).when for n in range(5)] == [1, 2, 3, 3, 3]
    with pytest.raises(ServiceError, match="503"):  # past retry_max: the error itself, which fails the run
        retried(5, _service_error(503))


def test_jittered_backoff_stays_within_zero_and_the_unjittered_wait(publish_task):
    settings = TrainerSettings(metrics_port=0, retry_max=10, retry_backoff_s=1, retry_backoff_max_s=20)
    _, retried = publish_task(settings)
    for n in range(6):
        ceiling = min(20, 2**n)
        waits = [retried(n, _service_error(502)).when for _ in range(100)]
        assert all(0 <= w <= ceiling for w in waits)
        assert n < 3 or len(set(waits)) > ceiling // 2  # drawn, not fixed


def test_retry_settings_come_from_the_environment(monkeypatch):
    monkeypatch.setenv("BRIDGE_TRAINER_RETRY_MAX", "3")
    monkeypatch.setenv("BRIDGE_TRAINER_RETRY_BACKOFF_S", "1")
    monkeypatch.setenv("BRIDGE_TRAINER_RETRY_BACKOFF_MAX_S", "4")
    monkeypatch.setenv("BRIDGE_TRAINER_RETRY_JITTER", "false")
    settings = TrainerSettings()
    assert (settings.retry_max, settings.retry_backoff_s, settings.retry_backoff_max_s) == (3, 1, 4)
    assert settings.retry_jitter is False


def test_a_cap_below_the_first_wait_is_refused_at_start_up():
    with pytest.raises(ValidationError, match="retry_backoff_max_s"):
        TrainerSettings(retry_backoff_s=10, retry_backoff_max_s=1)
