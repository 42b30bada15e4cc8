"""Shared fixtures: prepared models (once per machine), free ports, services started as subprocesses."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

REPO = Path(__file__).resolve().parents[1]
SHARED_DATA = Path(os.environ.get("BRIDGE_SHARED_DATA", REPO.parent / "shared" / "data"))
MODELS_CACHE = Path(os.environ.get("BRIDGE_TEST_MODELS", REPO / ".cache" / "test-data"))


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture(scope="session")
def models_root() -> Path:
    """A data dir whose models/ holds both prepared models (prepare is idempotent, so this is cheap later)."""
    from services.cli.prepare import prepare_retriever_model
    from services.common.settings import CommonSettings

    settings = CommonSettings(data_dir=MODELS_CACHE)
    prepare_retriever_model(settings.retriever_model_dir)
    return settings.models_dir


@pytest.fixture(scope="session")
def shared_data() -> Path:
    if not (SHARED_DATA / "corpus").exists():
        pytest.skip(f"shared data not found at {SHARED_DATA}")
    return SHARED_DATA


class ClientThreads:
    """`clients` threads, each running `self._run(n)` until the `with` block ends (`stop` is set), then joined:
    the shared part of the tests' load generators (a subclass writes `_run` and what it records)."""

    def __init__(self, url: str, clients: int, *, daemon: bool = False, join_timeout: float | None = None) -> None:
        self.url, self.stop, self.join_timeout = url, threading.Event(), join_timeout
        self.threads = [threading.Thread(target=self._run, args=(n,), daemon=daemon) for n in range(clients)]

    def _run(self, n: int) -> None:
        raise NotImplementedError

    def __enter__(self):
        for t in self.threads:
            t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        for t in self.threads:
            t.join(timeout=self.join_timeout)


@dataclass
class RunningService:
    url: str
    token: str
    data_dir: Path
    process: subprocess.Popen
    log_path: Path

    def log_tail(self, n: int = 40) -> str:
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-n:])


def start_service(
    name: str,
    data_dir: Path,
    env_extra: dict[str, str],
    ready_path: str = "/readyz",
    timeout: float = 180,
    port: int | None = None,
) -> RunningService:
    port = port or free_port()
    token = "test-admin-token"
    env = {**os.environ, "BRIDGE_DATA_DIR": str(data_dir), "BRIDGE_ADMIN_TOKEN": token, **env_extra}
    log_path = data_dir / f"{name}.log"
    data_dir.mkdir(parents=True, exist_ok=True)
    log = log_path.open("w")
    process = subprocess.Popen(
        [sys.executable, "-m", "services.cli.main", "serve", name, "--port", str(port)],
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        cwd=REPO,
    )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + timeout
    service = RunningService(url, token, data_dir, process, log_path)
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"{name} exited with {process.returncode}:\n{service.log_tail()}")
        try:
            if httpx.get(url + ready_path, timeout=2).status_code == 200:
                return service
        except httpx.TransportError:
            pass
        time.sleep(0.3)
    process.kill()
    raise TimeoutError(f"{name} not ready after {timeout}s:\n{service.log_tail()}")


def stop_service(service: RunningService) -> None:
    service.process.terminate()
    try:
        service.process.wait(timeout=30)
    except subprocess.TimeoutExpired:
        service.process.kill()
        service.process.wait()


def _retriever_factory(tmp_path_factory, models_root: Path) -> Iterator:
    started: list[RunningService] = []

    def start(label: str = "retriever", **env: str) -> RunningService:
        data_dir = tmp_path_factory.mktemp(label)
        service = start_service(
            "retriever",
            data_dir,
            {"BRIDGE_RETRIEVER_ENCODER_DIR": str(models_root / "all-MiniLM-L6-v2"), **env},
        )
        started.append(service)
        return service

    yield start
    for service in started:
        stop_service(service)


@pytest.fixture(scope="module")
def retriever_factory(tmp_path_factory, models_root) -> Iterator:
    """Retrievers of one module (each its own data dir, index and checkpoints), stopped after the module."""
    yield from _retriever_factory(tmp_path_factory, models_root)


@pytest.fixture(scope="session")
def session_retriever_factory(tmp_path_factory, models_root) -> Iterator:
    """Retrievers shared by every module of the session (read-only use only), stopped at its end."""
    yield from _retriever_factory(tmp_path_factory, models_root)


@pytest.fixture(scope="session")
def policy_models_root(models_root) -> Path:
    from services.cli.prepare import prepare_policy_model

    prepare_policy_model(models_root / "SmolLM2-135M-Instruct")
    return models_root


def policy_env(models_root: Path, retriever_url: str, **extra: str) -> dict[str, str]:
    import uuid

    return {
        "BRIDGE_POLICY_MODEL_DIR": str(models_root / "SmolLM2-135M-Instruct"),
        "BRIDGE_POLICY_INITIAL_SEARCH": "true",  # the raw base never writes <search> itself: keep the scaffold
        "BRIDGE_POLICY_RETRIEVER_URL": retriever_url,
        "BRIDGE_POLICY_VLLM_PORT": str(free_port()),
        # Set, so that a test (or bench) may ask the engine directly; unset, each start makes a key of its own.
        "BRIDGE_POLICY_VLLM_API_KEY": f"vllm-test-{uuid.uuid4().hex}",
        "BRIDGE_POLICY_TRAJECTORY_STREAM": f"bridge:test:{uuid.uuid4().hex[:8]}",
        "BRIDGE_POLICY_FEEDBACK_STREAM": f"bridge:test-feedback:{uuid.uuid4().hex[:8]}",
        "REDIS_URL": os.environ.get("BRIDGE_TEST_REDIS_URL", "redis://127.0.0.1:6379/0"),
        "VLLM_CACHE_ROOT": str(REPO / ".cache" / "vllm"),
        # The services under test start in 42 s instead of 60-75 (bench/engine_start.py): what they check is the
        # service on a real vLLM engine, not torch.compile; tests/e2e/test_up.py starts `up` compiled, as a user's.
        "BRIDGE_POLICY_VLLM_ENFORCE_EAGER": "true",
        **extra,
    }


def start_demo_retriever(factory, label: str = "demo-retriever") -> RunningService:
    """A retriever from `factory` holding the demo corpus that ships in the repo (800 hotpotqa passages)."""
    from services.cli.ingest import ingest_file
    from services.common.clients.retriever import RetrieverClient

    service = factory(label)
    with RetrieverClient(service.url, admin_token=service.token, timeout=600) as client:
        ingest_file(client, REPO / "services" / "demo_data" / "hotpotqa_corpus.jsonl", progress=False)
    return service


@pytest.fixture(scope="session")
def demo_retriever(session_retriever_factory) -> RunningService:
    """The demo-corpus retriever shared by the modules that only search it (one ingest a session, not one a
    module). A module that ingests, deletes, registers or activates starts its own (`start_demo_retriever` with
    `retriever_factory`)."""
    return start_demo_retriever(session_retriever_factory)


@pytest.fixture
def refusing_admin_server() -> Iterator[tuple[str, list[str | None]]]:
    """A stand-in admin endpoint that records each call's Authorization header and refuses (403) it: (url, seen)."""
    import json
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    seen: list[str | None] = []

    class Handler(BaseHTTPRequestHandler):
        def _refuse(self) -> None:
            seen.append(self.headers.get("authorization"))
            self.rfile.read(int(self.headers.get("content-length") or 0))
            body = json.dumps({"detail": "bad token", "error": {"type": "forbidden", "message": "bad token"}})
            self.send_response(403)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(body)))
            self.end_headers()
            self.wfile.write(body.encode())

        do_GET = do_POST = _refuse

        def log_message(self, *args) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}", seen
    server.shutdown()
    server.server_close()
