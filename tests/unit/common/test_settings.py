import stat
from pathlib import Path

from services.common.settings import CommonSettings
from services.retriever.settings import RetrieverSettings


def test_shared_variables_reach_every_service(monkeypatch, tmp_path):
    monkeypatch.setenv("BRIDGE_DATA_DIR", str(tmp_path))
    monkeypatch.setenv("QDRANT_URL", "http://qdrant:6333")
    monkeypatch.setenv("BRIDGE_RETRIEVER_PORT", "9001")
    settings = RetrieverSettings()
    assert settings.data_dir == tmp_path and settings.port == 9001
    assert settings.resolved_backend == "qdrant-server"
    monkeypatch.delenv("QDRANT_URL")
    assert RetrieverSettings().resolved_backend == "edge"


def test_admin_token_is_generated_once_and_private(tmp_path):
    settings = CommonSettings(data_dir=tmp_path)
    token = settings.resolve_admin_token()
    assert len(token) >= 32 and settings.resolve_admin_token() == token
    assert stat.S_IMODE((tmp_path / "admin_token").stat().st_mode) == 0o600
    assert CommonSettings(data_dir=tmp_path, admin_token="given").resolve_admin_token() == "given"


def test_production_refuses_a_missing_token(tmp_path):
    import pytest

    with pytest.raises(ValueError, match="BRIDGE_ADMIN_TOKEN"):
        CommonSettings(data_dir=tmp_path, environment="production").resolve_admin_token()


def test_a_generated_admin_token_says_where_it_is(tmp_path, caplog):
    import logging

    with caplog.at_level(logging.INFO, logger="services.common.settings"):
        CommonSettings(data_dir=tmp_path).resolve_admin_token()
        CommonSettings(data_dir=tmp_path).resolve_admin_token()
    generated, reused = (r.getMessage() for r in caplog.records)
    assert "generated" in generated and str(tmp_path / "admin_token") in generated
    assert "using the admin token stored in" in reused and str(tmp_path / "admin_token") in reused


def test_merged_adapter_serving_needs_vllm_and_auto_picks_by_device(monkeypatch):
    import pytest
    from pydantic import ValidationError

    from services.policy import settings as policy_settings
    from services.policy.settings import PolicySettings

    monkeypatch.setattr(policy_settings, "gpu_available", lambda: False)
    assert PolicySettings().serves_merged  # vLLM on a CPU: its LoRA path is ~7x slower than merged weights
    assert not PolicySettings(engine="transformers").serves_merged
    assert not PolicySettings(adapter_serving="lora").serves_merged
    assert not PolicySettings(vllm_url="http://vllm:8000").serves_merged  # not ours to reload
    monkeypatch.setattr(policy_settings, "gpu_available", lambda: True)
    assert not PolicySettings().serves_merged  # a GPU has vLLM's LoRA kernels
    assert PolicySettings(adapter_serving="merged").serves_merged
    with pytest.raises(ValidationError, match="transformers engine serves LoRA"):
        PolicySettings(adapter_serving="merged", engine="transformers")


def test_a_retrievers_state_dir_may_name_its_host(monkeypatch, tmp_path):
    """compose's replicas share one volume: `{hostname}` gives each its own folder in it (and none by default)."""
    import socket

    monkeypatch.setenv("BRIDGE_DATA_DIR", str(tmp_path))
    assert RetrieverSettings().state_dir == tmp_path / "retriever"
    monkeypatch.setenv("BRIDGE_RETRIEVER_STATE_DIR", "/data/retriever/{hostname}")
    assert RetrieverSettings().state_dir == Path("/data/retriever") / socket.gethostname()


def test_the_redis_password_comes_from_its_file_into_every_clients_url(tmp_path):
    from services.console.settings import ConsoleSettings
    from services.policy.settings import PolicySettings
    from services.trainer.settings import TrainerSettings

    secret = tmp_path / "redis_password"
    secret.write_text("p@ss/word:1\n")
    for cls in (CommonSettings, PolicySettings, TrainerSettings, ConsoleSettings, RetrieverSettings):
        assert cls().resolved_redis_url == "redis://127.0.0.1:6379/0"
        url = cls(redis_url="redis://redis:6379/0", redis_password_file=secret).resolved_redis_url
        assert url == "redis://:p%40ss%2Fword%3A1@redis:6379/0", cls
    import redis

    kwargs = redis.connection.parse_url(url)
    assert kwargs["password"] == "p@ss/word:1" and kwargs["host"] == "redis"  # what redis-py sends to AUTH
    given = CommonSettings(redis_url="redis://:own@redis:6379/0", redis_password_file=secret).resolved_redis_url
    assert given == "redis://:own@redis:6379/0"  # a URL that carries a password keeps it
