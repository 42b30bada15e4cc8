"""Only `BRIDGE_*` variables configure BRIDGE: an unprefixed DATA_DIR, ADMIN_TOKEN, ENVIRONMENT or CHECKPOINT_DIR
(set for some other program) is ignored by every service's settings; the prefixed one is honoured."""

from __future__ import annotations

import pytest

from services.common.settings import DEFAULT_DATA_DIR, CommonSettings
from services.console.settings import ConsoleSettings
from services.policy.settings import PolicySettings
from services.retriever.settings import RetrieverSettings
from services.trainer.settings import TrainerSettings

SHARED = ("DATA_DIR", "ADMIN_TOKEN", "ENVIRONMENT", "CHECKPOINT_DIR")
SETTINGS = [CommonSettings, RetrieverSettings, PolicySettings, TrainerSettings, ConsoleSettings]


@pytest.fixture
def clean_env(monkeypatch):
    for name in SHARED:
        monkeypatch.delenv(f"BRIDGE_{name}", raising=False)
        monkeypatch.delenv(name, raising=False)
    return monkeypatch


@pytest.mark.parametrize("settings_class", SETTINGS, ids=lambda c: c.__name__)
def test_unprefixed_variables_are_ignored(clean_env, tmp_path, settings_class):
    clean_env.setenv("DATA_DIR", str(tmp_path / "someone-elses"))
    clean_env.setenv("ADMIN_TOKEN", "someone-elses-token")
    clean_env.setenv("ENVIRONMENT", "production")
    clean_env.setenv("CHECKPOINT_DIR", str(tmp_path / "someone-elses-checkpoints"))
    settings = settings_class()
    assert settings.data_dir == DEFAULT_DATA_DIR.expanduser().resolve()
    assert settings.admin_token is None and settings.environment == "development"
    assert settings.checkpoint_dir is None


@pytest.mark.parametrize("settings_class", SETTINGS, ids=lambda c: c.__name__)
def test_prefixed_variables_are_honoured(clean_env, tmp_path, settings_class):
    clean_env.setenv("DATA_DIR", str(tmp_path / "someone-elses"))
    clean_env.setenv("BRIDGE_DATA_DIR", str(tmp_path / "ours"))
    clean_env.setenv("BRIDGE_ADMIN_TOKEN", "our-token")
    clean_env.setenv("BRIDGE_ENVIRONMENT", "staging")
    clean_env.setenv("BRIDGE_CHECKPOINT_DIR", str(tmp_path / "ckpt"))
    settings = settings_class()
    assert settings.data_dir == (tmp_path / "ours").resolve() and settings.admin_token == "our-token"
    assert settings.environment == "staging" and settings.checkpoint_root == (tmp_path / "ckpt").resolve()


def test_constructor_arguments_still_work_by_field_name(clean_env, tmp_path):
    settings = RetrieverSettings(data_dir=tmp_path, admin_token="t", environment="staging", checkpoint_dir=tmp_path)
    assert (settings.data_dir, settings.admin_token, settings.environment) == (tmp_path.resolve(), "t", "staging")
