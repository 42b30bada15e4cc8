"""HAProxy in front of a service's replicas: one address, health-checked on /readyz, with retries.

A replica that is down (a refused connection) or out of rotation (a 503: behind its group's checkpoint version,
services/common/replicas.py) gets no new requests once its check fails, and a request it refuses before that is
retried at another replica (`retry-on`), so a swap or a crashed replica costs a client nothing. Debian's haproxy
(`apt-get install haproxy`); never a hand-written proxy.
"""

from __future__ import annotations

import shutil
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path

import httpx


def haproxy_config(port: int, backends: Sequence[tuple[str, int]], *, host: str = "127.0.0.1",
                   check_ms: int = 500) -> str:  # fmt: skip
    """An HTTP load balancer on host:port over `backends` ((host, port) each), round robin, /readyz checks."""
    servers = "\n".join(f"  server r{n} {h}:{p} check" for n, (h, p) in enumerate(backends))
    return _config(port, host, check_ms, servers)


def haproxy_dns_config(port: int, service: str, service_port: int, *, max_replicas: int = 16, host: str = "0.0.0.0",
                       nameserver: str = "127.0.0.11:53", check_ms: int = 500) -> str:  # fmt: skip
    """The same balancer over every address the name `service` resolves to (compose's `--scale service=N`: Docker's
    DNS at 127.0.0.11 answers one address per replica): up to `max_replicas` slots, filled and emptied as replicas
    come and go (re-resolved every second), so scaling needs no restart of the balancer."""
    servers = f"  server-template r 1-{max_replicas} {service}:{service_port} check resolvers dns init-addr none"
    resolvers = f"""resolvers dns
  nameserver ns {nameserver}
  accepted_payload_size 8192
  resolve_retries 3
  timeout resolve 1s
  timeout retry 1s
  hold valid 1s
  hold obsolete 5s

"""
    return _config(port, host, check_ms, servers, resolvers)


def _config(port: int, host: str, check_ms: int, servers: str, resolvers: str = "") -> str:
    return f"""global
  maxconn 1024

defaults
  mode http
  timeout connect 2s
  timeout client 600s
  timeout server 600s
  retries 3
  option redispatch 1
  option http-buffer-request
  retry-on conn-failure empty-response response-timeout 503

{resolvers}frontend bridge
  bind {host}:{port}
  default_backend replicas

backend replicas
  balance roundrobin
  option httpchk GET /readyz
  http-check expect status 200
  default-server inter {check_ms}ms fall 1 rise 2
{servers}
"""


def haproxy_binary() -> str:
    binary = shutil.which("haproxy") or "/usr/sbin/haproxy"
    if not Path(binary).exists():
        raise FileNotFoundError("haproxy is not installed (Debian: apt-get install haproxy)")
    return binary


def haproxy_command(port: int, backends: Sequence[tuple[str, int]], folder: Path, *,
                    host: str = "127.0.0.1") -> list[str]:  # fmt: skip
    """The command line of haproxy over `backends` on `port`, its configuration written to `folder` and checked
    first (a ValueError with haproxy's reason when it refuses it)."""
    return checked_command(haproxy_config(port, backends, host=host), folder)


def checked_command(config: str, folder: Path) -> list[str]:
    """haproxy's command line for `config`, written to `folder`/haproxy.cfg and checked by haproxy first."""
    binary = haproxy_binary()
    folder.mkdir(parents=True, exist_ok=True)
    config_path = folder / "haproxy.cfg"
    config_path.write_text(config)
    check = subprocess.run([binary, "-c", "-f", str(config_path)], capture_output=True, text=True)
    if check.returncode != 0:
        raise ValueError(f"haproxy refused its configuration: {check.stdout}{check.stderr}")
    return [binary, "-db", "-f", str(config_path)]


class Balancer:
    """A running haproxy process over `backends`; `url` is the one address clients use."""

    def __init__(self, port: int, backends: Sequence[tuple[str, int]], folder: Path) -> None:
        command = haproxy_command(port, backends, folder)
        self.log = (folder / "haproxy.log").open("w")
        self.process = subprocess.Popen(command, stdout=self.log, stderr=subprocess.STDOUT)
        self.url = f"http://127.0.0.1:{port}"

    def wait_ready(self, timeout: float = 30) -> None:
        """Until a request through it reaches a ready replica."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"haproxy exited with {self.process.returncode}")
            try:
                if httpx.get(self.url + "/readyz", timeout=2).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            time.sleep(0.2)
        raise TimeoutError(f"no replica ready behind {self.url} after {timeout}s")

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        self.log.close()
