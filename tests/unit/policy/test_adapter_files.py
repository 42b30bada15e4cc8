"""A policy adapter's hashed files must be what they claim before the engine sees them."""

from __future__ import annotations

import json

import numpy as np
import pytest
from safetensors.numpy import save_file

from services.common.errors import InvalidRequest
from services.policy.adapters import check_adapter_files


def adapter(folder, weights: bytes | None = None, config: str = '{"r": 8}'):
    folder.mkdir(exist_ok=True)
    if weights is None:
        save_file({"lora_A": np.zeros((2, 2), dtype=np.float32)}, str(folder / "adapter_model.safetensors"))
    else:
        (folder / "adapter_model.safetensors").write_bytes(weights)
    (folder / "adapter_config.json").write_text(config)
    return folder


def test_a_real_adapter_passes(tmp_path):
    check_adapter_files(adapter(tmp_path / "ok"))


@pytest.mark.parametrize(
    ("weights", "config", "reason"),
    [
        (b"PK\x03\x04 a zip of pickles", '{"r": 8}', "not a safetensors file"),
        (None, "{not json", "not JSON"),
        (None, json.dumps([1, 2]), "not a JSON object"),
    ],
)
def test_files_that_are_not_what_they_claim_are_a_400_with_the_reason(tmp_path, weights, config, reason):
    with pytest.raises(InvalidRequest, match=reason) as err:
        check_adapter_files(adapter(tmp_path / "bad", weights, config))
    assert err.value.status_code == 400


def manifested(folder):
    from services.common.checkpoints import MANIFEST, Manifest, sha256_file

    files = {name: sha256_file(folder / name) for name in ("adapter_model.safetensors", "adapter_config.json")}
    manifest = Manifest(kind="policy-lora", version="v1", files=files)
    (folder / MANIFEST).write_text(manifest.model_dump_json())
    return manifest


def test_the_engine_loads_the_copy_that_was_verified_not_the_checkpoint_folder(tmp_path):
    """Verified, then swapped before the engine reads it: the load is refused (a copy hashed as it is made), and a
    good adapter reaches the engine as a private copy, so a later swap in the checkpoint root changes nothing."""
    import asyncio

    from services.common.checkpoints import load_manifest
    from services.common.registry import CheckpointEntry
    from services.policy.adapters import AdapterLoader

    class RecordingEngine:  # the engine is not what this tests: where it is told to read
        def __init__(self):
            self.paths = {}

        async def load_adapter(self, name, path):
            self.paths[name] = path

        async def unload_adapter(self, name):
            self.paths.pop(name)

    root = tmp_path / "checkpoints"
    root.mkdir()
    folder = adapter(root / "v1")
    manifested(folder)
    engine = RecordingEngine()
    loader = AdapterLoader(engine, tmp_path / "verified")
    entry = CheckpointEntry(version="v1", path=str(folder), kind="policy-lora")
    checked_folder, manifest = load_manifest(root, folder)
    (folder / "adapter_config.json").write_text('{"r": 64}')  # after the hash, before the engine
    with pytest.raises(InvalidRequest, match="changed after it was verified"):
        asyncio.run(loader.load(None, entry, checked_folder, manifest))
    assert engine.paths == {} and not (tmp_path / "verified" / "v1").exists()

    (folder / "adapter_config.json").write_text('{"r": 8}')
    checked_folder, manifest = load_manifest(root, folder)
    asyncio.run(loader.load(None, entry, checked_folder, manifest))
    copy = engine.paths["v1"]
    assert copy == tmp_path / "verified" / "v1" and (copy / "adapter_config.json").read_text() == '{"r": 8}'
    (folder / "adapter_config.json").write_text('{"r": 64}')
    assert (copy / "adapter_config.json").read_text() == '{"r": 8}'
    asyncio.run(loader.unload("v1", "v1"))
    assert not copy.exists()


def test_a_link_put_in_place_after_verification_is_refused(tmp_path):
    from services.common.checkpoints import copy_verified

    folder = adapter(tmp_path / "v1")
    manifest = manifested(folder)
    target = folder / "adapter_config.json"
    (tmp_path / "elsewhere.json").write_text('{"r": 8}')
    target.unlink()
    target.symlink_to(tmp_path / "elsewhere.json")
    with pytest.raises(InvalidRequest, match="cannot be read"):
        copy_verified(folder, manifest, tmp_path / "copy")
