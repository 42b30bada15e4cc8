"""Issue #7, crash safety on real processes: the retriever killed (SIGKILL) mid-ingest, Redis restarted under the
policy and under a Celery worker, and an LLM engine that accepts a request and never answers.

(The kill -9 of a trainer worker mid-round lives in test_trainer.py, on that module's stack.)"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx
import pytest

from tests.conftest import REPO, free_port, policy_env, start_service, stop_service

pytestmark = pytest.mark.slow


class PrivateRedis:
    """A real redis-server of this test's own (no persistence), so it can be killed and restarted."""

    def __init__(self, data_dir: Path) -> None:
        self.port = free_port()
        self.data_dir = data_dir
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.process: subprocess.Popen | None = None

    def start(self) -> None:
        import redis

        args = ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
                "--dir", str(self.data_dir)]  # fmt: skip
        self.process = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 30
        while True:
            try:
                if redis.Redis(port=self.port, socket_timeout=1).ping():
                    return
            except redis.ConnectionError:
                assert time.monotonic() < deadline, "redis-server did not start"
                time.sleep(0.1)

    def kill(self) -> None:
        self.process.kill()  # SIGKILL: as a crash, not a clean shutdown
        self.process.wait()


@pytest.fixture(scope="module")
def private_redis(tmp_path_factory) -> Iterator[PrivateRedis]:
    if not any((Path(p) / "redis-server").exists() for p in os.environ.get("PATH", "").split(os.pathsep)):
        pytest.skip("redis-server is not on PATH")
    server = PrivateRedis(tmp_path_factory.mktemp("redis"))
    server.start()
    yield server
    if server.process.poll() is None:
        server.kill()


class HangingEngine:
    """Speaks just enough of vLLM's server to pass the policy's health check; every completion request is
    accepted and never answered (the failure mode a wedged GPU worker shows)."""

    def __init__(self) -> None:
        self.release = threading.Event()
        self.requests = 0
        engine = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                body = b"{}"
                self.send_response(200)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_POST(self) -> None:
                engine.requests += 1
                self.rfile.read(int(self.headers.get("content-length", 0)))
                engine.release.wait(600)

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.release.set()
        self.server.shutdown()


@pytest.fixture(scope="module")
def light_policy(tmp_path_factory, policy_models_root, private_redis):
    """The policy on the vLLM engine pointed at a hanging engine, its store on the private Redis: a real service
    that starts in seconds (only the tokenizer loads)."""
    engine = HangingEngine()
    env = policy_env(
        policy_models_root, f"http://127.0.0.1:{free_port()}", BRIDGE_POLICY_VLLM_URL=engine.url,
        BRIDGE_POLICY_REQUEST_TIMEOUT_S="3", BRIDGE_POLICY_INITIAL_SEARCH="false", REDIS_URL=private_redis.url,
    )  # fmt: skip
    service = start_service("policy", tmp_path_factory.mktemp("policy-light"), env, timeout=300)
    service.engine = engine
    yield service
    stop_service(service)
    engine.close()


def test_a_hung_engine_call_fails_cleanly_within_the_timeout(light_policy):
    started = time.monotonic()
    response = httpx.post(light_policy.url + "/v1/agent/query", json={"question": "Who wrote Hamlet?", "max_turns": 0},
                          timeout=60)  # fmt: skip
    elapsed = time.monotonic() - started
    assert light_policy.engine.requests >= 1  # the engine got the request and sat on it
    assert response.status_code == 502, response.text
    body = response.json()
    assert body["error"]["type"] == "upstream_unavailable" and "did not answer within 3" in body["detail"]
    assert 3 <= elapsed < 15
    assert httpx.get(light_policy.url + "/healthz").status_code == 200  # and the service carries on


def test_one_query_may_not_outlive_the_agent_deadline(tmp_path, policy_models_root, private_redis):
    """The engine call alone would wait 120 s; the request's own deadline (2 s here) answers 504 first."""
    engine = HangingEngine()
    env = policy_env(
        policy_models_root, f"http://127.0.0.1:{free_port()}", BRIDGE_POLICY_VLLM_URL=engine.url,
        BRIDGE_POLICY_REQUEST_TIMEOUT_S="120", BRIDGE_POLICY_AGENT_DEADLINE_S="2",
        BRIDGE_POLICY_INITIAL_SEARCH="false", REDIS_URL=private_redis.url,
    )  # fmt: skip
    service = start_service("policy", tmp_path / "policy-deadline", env, timeout=300)
    try:
        started = time.monotonic()
        response = httpx.post(service.url + "/v1/agent/query", json={"question": "Who wrote Hamlet?"}, timeout=60)
        elapsed = time.monotonic() - started
        assert response.status_code == 504, response.text
        body = response.json()
        assert body["error"]["type"] == "deadline_exceeded" and "deadline of 2 s" in body["detail"]
        assert 2 <= elapsed < 10 and engine.requests >= 1
        assert httpx.get(service.url + "/healthz").status_code == 200
    finally:
        stop_service(service)
        engine.close()


def test_policy_rides_out_a_redis_restart_and_answers_503_while_it_is_down(light_policy, private_redis):
    url = light_policy.url
    unknown = url + "/v1/trajectories/no-such-id"
    assert httpx.get(unknown).status_code == 404  # Redis answered: the id is simply unknown

    private_redis.kill()
    started = time.monotonic()
    down = httpx.get(unknown, timeout=60)
    waited = time.monotonic() - started
    assert down.status_code == 503, down.text  # a clear 503, not a 500
    assert down.json()["error"]["code"] == "redis_unavailable" and "Redis" in down.json()["detail"]
    assert 5 < waited < 30  # it retried with backoff (about 11 s) before giving up
    assert httpx.get(url + "/readyz", timeout=60).status_code == 503

    private_redis.start()
    assert httpx.get(unknown, timeout=60).status_code == 404  # reconnected, no restart of the service

    # A restart shorter than the backoff window is invisible to the caller.
    private_redis.kill()
    result: dict[str, httpx.Response] = {}
    caller = threading.Thread(target=lambda: result.setdefault("r", httpx.get(unknown, timeout=60)))
    caller.start()
    time.sleep(2)
    private_redis.start()
    caller.join(60)
    assert result["r"].status_code == 404, result["r"].text
    assert httpx.get(url + "/readyz").status_code == 200


def test_celery_worker_reconnects_to_a_restarted_broker(private_redis, tmp_path):
    from services.trainer.celery_app import make_celery
    from services.trainer.settings import TrainerSettings

    queue = f"bridge-test-broker-{os.getpid()}"
    env = {**os.environ, "REDIS_URL": private_redis.url, "BRIDGE_TRAINER_QUEUE": queue,
           "BRIDGE_DATA_DIR": str(tmp_path), "BRIDGE_ADMIN_TOKEN": "test-admin-token"}  # fmt: skip
    log_path = tmp_path / "worker.log"
    with log_path.open("w") as log:
        worker = subprocess.Popen([sys.executable, "-m", "services.cli.main", "worker"], env=env, cwd=REPO,
                                  stdout=log, stderr=subprocess.STDOUT)  # fmt: skip
    app = make_celery(TrainerSettings(redis_url=private_redis.url, queue=queue, data_dir=tmp_path))
    try:
        # celery.accumulate is Celery's built-in echo task: a round trip through broker, worker and backend.
        assert app.send_task("celery.accumulate", args=(1, 2)).get(timeout=120) == [1, 2], log_path.read_text()
        private_redis.kill()
        time.sleep(3)
        private_redis.start()  # empty: the queue and results are gone, the worker must reconnect on its own
        deadline = time.monotonic() + 90
        while True:
            try:
                echoed = app.send_task("celery.accumulate", args=(3,)).get(timeout=10)
                break
            except Exception:  # the producer's own connection is reconnecting too
                assert worker.poll() is None, log_path.read_text()[-3000:]
                assert time.monotonic() < deadline, log_path.read_text()[-3000:]
        assert echoed == [3] and worker.poll() is None
    finally:
        worker.terminate()
        worker.wait(timeout=60)


def test_retriever_killed_mid_ingest_then_rerun_has_every_document_once(
    tmp_path_factory, models_root, shared_data, tmp_path
):
    from services.cli.ingest import ingest_file, read_documents
    from services.common.clients.retriever import RetrieverClient

    corpus = tmp_path / "corpus.jsonl"
    # 600 passages keep the test near a minute on 2 cores; the mechanism does not depend on the size.
    lines = (shared_data / "corpus" / "hotpotqa.jsonl").read_text().splitlines()[:600]
    corpus.write_text("\n".join(lines) + "\n")
    docs = {d.id: d for d in read_documents(corpus)}
    data_dir = tmp_path_factory.mktemp("retriever-crash")
    env = {"BRIDGE_RETRIEVER_ENCODER_DIR": str(models_root / "all-MiniLM-L6-v2")}
    service = start_service("retriever", data_dir, env)

    failure: list[BaseException] = []

    def ingest() -> None:
        try:
            with RetrieverClient(service.url, admin_token=service.token, timeout=600) as client:
                ingest_file(client, corpus, batch_size=32, progress=False)
        except BaseException as exc:  # the server dies under it: that is the point
            failure.append(exc)

    loader = threading.Thread(target=ingest)
    loader.start()
    deadline = time.monotonic() + 600
    while httpx.get(service.url + "/readyz", timeout=30).json()["documents"] < len(docs) // 3:
        assert loader.is_alive() and time.monotonic() < deadline, service.log_tail()
        time.sleep(0.2)
    service.process.kill()  # SIGKILL mid-ingest: a batch is half-way through the encoder or the index
    service.process.wait()
    loader.join(120)
    assert failure, "the ingest finished before the kill: nothing was tested"

    service = start_service("retriever", data_dir, env)  # same data dir, same index
    try:
        survived = httpx.get(service.url + "/readyz").json()["documents"]
        assert 0 < survived < len(docs)
        with RetrieverClient(service.url, admin_token=service.token, timeout=600) as client:
            result = ingest_file(client, corpus, batch_size=32, progress=False)
            assert result["upserted"] + result["unchanged"] == len(docs)
            assert result["unchanged"] > 0  # what was in before the kill was kept, not embedded again
            assert client.ready()["documents"] == len(docs)  # no duplicates, none missing
            for doc_id, doc in docs.items():  # every id there, whole
                stored = client.get_document(doc_id)
                assert (stored.title, stored.text) == (doc.title, doc.text)
        print(json.dumps({"survived_kill": survived, **result}))
    finally:
        stop_service(service)
