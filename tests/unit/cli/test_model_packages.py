"""`bridge-rl prepare` takes model files from PyPI packages only after checking each against its recorded sha256."""

from __future__ import annotations

import hashlib

import pytest

from services.cli import model_packages
from services.cli.model_packages import PACKAGE_FILES, ModelPackageMismatch, verify_package
from services.cli.prepare import package_dir


@pytest.mark.parametrize("name", sorted(PACKAGE_FILES))
def test_the_installed_model_packages_are_the_recorded_ones(name):
    verify_package(name, package_dir(name))


def test_a_changed_or_missing_file_is_refused(tmp_path, monkeypatch):
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "config.json").write_text('{"hidden_size": 384}')
    recorded = hashlib.sha256(b'{"hidden_size": 384}').hexdigest()
    monkeypatch.setitem(model_packages.PACKAGE_FILES, "fake_package", {"model/config.json": recorded})
    verify_package("fake_package", tmp_path)
    (tmp_path / "model" / "config.json").write_text('{"hidden_size": 385}')
    with pytest.raises(ModelPackageMismatch, match="model/config.json has sha256"):
        verify_package("fake_package", tmp_path)
    (tmp_path / "model" / "config.json").unlink()
    with pytest.raises(ModelPackageMismatch, match="missing"):
        verify_package("fake_package", tmp_path)
