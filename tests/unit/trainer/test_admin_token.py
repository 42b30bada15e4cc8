"""The trainer is a client of both services: it sends BRIDGE_ADMIN_TOKEN, else the token file a server of this host
wrote, and never creates that file (only servers do)."""

from __future__ import annotations

import pytest

from services.common.clients.base import ServiceError
from services.trainer.publish import publish_retriever
from services.trainer.retry import is_transient
from services.trainer.settings import MissingAdminToken, TrainerSettings


@pytest.fixture(autouse=True)
def _no_token_in_env(monkeypatch):
    monkeypatch.delenv("BRIDGE_ADMIN_TOKEN", raising=False)


@pytest.fixture
def retriever(refusing_admin_server):
    return refusing_admin_server


def test_no_token_anywhere_fails_permanently_and_creates_no_file(tmp_path, retriever):
    url, seen = retriever
    settings = TrainerSettings(data_dir=tmp_path, retriever_url=url)
    with pytest.raises(MissingAdminToken, match="BRIDGE_ADMIN_TOKEN") as caught:
        publish_retriever(settings, tmp_path / "round-0", "v1")
    assert not settings.admin_token_file.exists() and seen == []
    assert not is_transient(caught.value)  # the run fails with the reason instead of retrying


def test_reads_the_servers_token_file(tmp_path, retriever):
    url, seen = retriever
    settings = TrainerSettings(data_dir=tmp_path, retriever_url=url)
    settings.admin_token_file.write_text("from-the-server\n")
    with pytest.raises(ServiceError):
        publish_retriever(settings, tmp_path / "round-0", "v1")
    assert seen == ["Bearer from-the-server"]


def test_configured_token_wins(tmp_path, monkeypatch):
    monkeypatch.setenv("BRIDGE_ADMIN_TOKEN", "configured")
    settings = TrainerSettings(data_dir=tmp_path)
    settings.admin_token_file.write_text("from-the-server")
    assert settings.services_admin_token() == "configured"


def test_the_round_steps_use_the_clients_token():
    """collect and publish take the token through the client-side call, never the server's generator."""
    from pathlib import Path

    import services.trainer.collect as collect
    import services.trainer.publish as publish

    for module in (collect, publish):
        source = Path(module.__file__).read_text()
        assert "resolve_admin_token" not in source and "services_admin_token()" in source
