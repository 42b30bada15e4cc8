"""docs/configuration.md's table is what `python -m tools.settings_table` generates from the settings classes now:
a field added, renamed or re-documented without regenerating the page fails here."""

from __future__ import annotations

import importlib
import pkgutil

from pydantic_settings import BaseSettings

import services
from tools import settings_table


def test_the_configuration_page_is_up_to_date():
    page = settings_table.PAGE.read_text()
    assert settings_table.render(page) == page, "docs/configuration.md is stale: python -m tools.settings_table --write"


def test_every_settings_class_and_field_is_in_the_table():
    listed = {name for _, name, _ in settings_table.CLASSES}
    found = set()
    for module in pkgutil.iter_modules(services.__path__):
        try:
            settings = importlib.import_module(f"services.{module.name}.settings")
        except ModuleNotFoundError:
            continue
        found |= {
            name
            for name, obj in vars(settings).items()
            if isinstance(obj, type) and issubclass(obj, BaseSettings) and obj.__module__ == settings.__name__
        }
    assert found == listed
    table = settings_table.table()
    for variable in ("`BRIDGE_DATA_DIR`", "`REDIS_URL`", "`BRIDGE_POLICY_ENGINE`", "`BRIDGE_TRAINER_QA_DIR`",
                     "`BRIDGE_CONSOLE_PORT`", "`BRIDGE_RETRIEVER_DTYPE`"):  # fmt: skip
        assert variable in table
    assert str(settings_table.REPO) not in table  # nothing of the machine that generated it
