"""The checkpoint registry's rules, on a loader that records what it loads and unloads (no model needed)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from services.common.checkpoints import Manifest, publish_checkpoint, staging_dir
from services.common.errors import Conflict, InvalidRequest, NotFound
from services.common.registry import CheckpointEntry, CheckpointRegistry, VersionTable, WeightsLoader


class RecordingLoader(WeightsLoader[str]):
    noun = "policy"
    kinds = ("policy-lora",)

    def __init__(self) -> None:
        self.events: list[str] = []

    async def load(self, registry, entry: CheckpointEntry, folder: Path | None, manifest: Manifest | None) -> str:
        if manifest is not None and manifest.extra.get("broken"):
            raise InvalidRequest("weights do not load", param="path")
        self.events.append(f"load {entry.version}")
        return entry.version

    async def unload(self, version: str, weights: str) -> None:
        self.events.append(f"unload {version}")


def checkpoint(root: Path, version: str, **extra) -> str:
    staging = staging_dir(root, version)
    (staging / "weights.safetensors").write_bytes(b"weights " + version.encode())
    publish_checkpoint(staging, root / version, kind="policy-lora", version=version, extra=extra)
    return version


def test_register_activate_rollback_and_drain(tmp_path):
    async def scenario() -> None:
        loader = RecordingLoader()
        registry = CheckpointRegistry(loader, VersionTable, tmp_path / "registry.json", tmp_path)
        await registry.restore(previous=True)
        assert registry.active == "base" and loader.events == ["load base"]

        await registry.register(checkpoint(tmp_path, "v1"))
        assert await registry.register("v1") is not None  # the same folder again: a no-op
        assert loader.events[-2:] == ["load v1", "unload v1"]  # loaded to check it, then drained
        with pytest.raises(InvalidRequest):
            await registry.register(checkpoint(tmp_path, "broken", broken=True))
        assert "broken" not in registry.table.checkpoints

        async with registry.lease() as pinned:  # a request on base while v1 becomes active
            response = await registry.activate("v1")
            assert (response.active, response.previous, response.status) == ("v1", "base", "active")
            assert pinned == "base" and "base" in registry._loaded
        async with registry.lease("v1") as pinned:
            assert pinned == "v1"
        with pytest.raises(NotFound) as info:
            async with registry.lease("nope"):
                pass
        assert info.value.param == "model" and info.value.code == "model_not_found"
        with pytest.raises(NotFound):
            await registry.activate("nope")

        rolled = await registry.rollback()
        assert (rolled.active, rolled.previous) == ("base", "v1")
        again = CheckpointRegistry(RecordingLoader(), VersionTable, tmp_path / "registry.json", tmp_path)
        assert (again.table.active, again.table.previous) == ("base", "v1")  # persisted

    asyncio.run(scenario())


def test_rollback_without_previous_and_a_failed_version_are_conflicts(tmp_path):
    async def scenario() -> None:
        registry = CheckpointRegistry(RecordingLoader(), VersionTable, tmp_path / "registry.json", tmp_path)
        await registry.restore(previous=True)
        with pytest.raises(Conflict):
            await registry.rollback()
        await registry.register(checkpoint(tmp_path, "v1"))
        registry.table.checkpoints["v1"].state, registry.table.checkpoints["v1"].error = "failed", "Boom: no"
        with pytest.raises(Conflict) as info:
            await registry.activate("v1")
        assert "Boom: no" in info.value.message

    asyncio.run(scenario())
