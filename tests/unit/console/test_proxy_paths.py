"""The console passes only the services' API paths: the whole path must match, so a trailing newline (`%0A`) or any
other suffix is refused with 400 before anything is forwarded."""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient

from services.console.app import build_app
from services.console.settings import ConsoleSettings


@pytest.fixture
def console(tmp_path):
    # Nothing listens on these ports: a path the allowlist passes is forwarded and fails with 502.
    closed = "http://127.0.0.1:9"
    settings = ConsoleSettings(data_dir=tmp_path, policy_url=closed, retriever_url=closed, trainer_url=closed)
    with TestClient(build_app(settings)) as client:
        yield client


@pytest.mark.parametrize("path", ["v1/checkpoints%0A", "healthz%0A", "v1/checkpoints%20", "v1/a%2F..%2Fb", "admin"])
def test_paths_outside_the_api_are_refused(console, path):
    response = console.get(f"/api/policy/{path}")
    assert response.status_code == 400, response.text
    assert "not a service API path" in response.json()["detail"]


def test_an_api_path_is_forwarded(console):
    assert console.get("/api/policy/v1/checkpoints").status_code == 502  # passed, then the upstream is unreachable


def test_the_console_answers_only_its_trusted_hosts(tmp_path):
    """The console is what a browser reaches: a rebound name must not get its page or its pass-through."""
    closed = "http://127.0.0.1:9"
    settings = ConsoleSettings(data_dir=tmp_path, policy_url=closed, retriever_url=closed, trainer_url=closed,
                               trusted_hosts="127.0.0.1,localhost")  # fmt: skip
    with TestClient(build_app(settings), base_url="http://127.0.0.1") as client:
        assert client.get("/").status_code == 200
        for path in ("/", "/api/policy/v1/checkpoints"):
            assert client.get(path, headers={"host": "rebound.attacker.test"}).status_code == 400
