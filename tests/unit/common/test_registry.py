"""The checkpoint registry's rules, on a loader that records what it loads and unloads (no model needed)."""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path

import pytest

from services.common import registry as registry_module
from services.common.checkpoints import Manifest, load_manifest, publish_checkpoint, staging_dir
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


def test_pinned_versions_stay_loaded_up_to_the_bound_least_recently_used_dropped_first(tmp_path, monkeypatch):
    """A request pinned to a version that is not active loaded, sha-checked and unloaded it every time."""
    verified: list[str] = []

    def counting(root, path):
        verified.append(str(path))
        return load_manifest(root, path)

    monkeypatch.setattr(registry_module, "load_manifest", counting)

    async def scenario() -> None:
        loader = RecordingLoader()
        registry = CheckpointRegistry(loader, VersionTable, tmp_path / "registry.json", tmp_path, keep_pinned=2)
        await registry.restore(previous=True)
        for version in ("v1", "v2", "v3"):
            await registry.register(checkpoint(tmp_path, version))
        loader.events.clear()
        verified.clear()

        async def request(version: str) -> None:
            async with registry.lease(version):
                pass
            assert len(set(registry._loaded) - {registry.active}) <= 2  # never more pinned than the bound

        await request("v1")
        await request("v1")
        assert loader.events == ["load v1"] and len(verified) == 1  # the second request found it loaded
        await request("v2")
        await request("v1")  # v1 is now the most recently used, v2 the least
        await request("v3")
        assert loader.events == ["load v1", "load v2", "load v3", "unload v2"]
        assert set(registry._loaded) == {"base", "v1", "v3"}
        await request("v2")
        assert loader.events[-2:] == ["load v2", "unload v1"]

        plain = CheckpointRegistry(RecordingLoader(), VersionTable, tmp_path / "registry.json", tmp_path)
        await plain.restore(previous=False)  # no bound (the default): a pinned version goes with its request
        for _ in range(2):
            async with plain.lease("v2"):
                pass
        assert plain.loader.events == ["load base", "load v2", "unload v2", "load v2", "unload v2"]

    asyncio.run(scenario())


def test_leftovers_of_an_interrupted_replace_are_removed_at_start(tmp_path):
    """A crash in the middle of `publish_checkpoint(replace=True)` left the old folder moved aside, or a staging
    folder; a staging folder written to lately may be a trainer's, being filled now, and stays."""
    checkpoint(tmp_path, "v1")
    for name in (".v1.replaced-0a1b2c", ".tmp-v2-0badc0de", ".tmp-v3-12345678"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "weights.safetensors").write_bytes(b"x")
    hours_ago = time.time() - 2 * 3600
    for path in (tmp_path / ".tmp-v2-0badc0de", tmp_path / ".tmp-v2-0badc0de" / "weights.safetensors"):
        os.utime(path, (hours_ago, hours_ago))

    async def scenario() -> None:
        registry = CheckpointRegistry(RecordingLoader(), VersionTable, tmp_path / "registry.json", tmp_path)
        await registry.restore(previous=False)
        await registry.register("v1")

    asyncio.run(scenario())
    assert sorted(p.name for p in tmp_path.iterdir() if p.is_dir()) == [".tmp-v3-12345678", "v1"]


async def v2_active_over_v1(root: Path) -> None:
    """A registry file at `root` with v2 active and v1 previous, both registered from good checkpoints."""
    registry = CheckpointRegistry(RecordingLoader(), VersionTable, root / "registry.json", root)
    await registry.restore(previous=True)
    for version in ("v1", "v2"):
        await registry.register(checkpoint(root, version))
        await registry.activate(version)


@pytest.mark.parametrize("corrupt", [("v2",), ("v2", "v1")])
def test_a_corrupt_active_checkpoint_at_start_serves_the_last_good_version_loudly(tmp_path, corrupt):
    """A bad disk must not make a crash loop: v2 active, v1 previous; with v2 (or both) corrupt on disk, start
    serves v1 (or base), records why, and the corrupt versions are failed, not loaded."""

    async def scenario() -> None:
        await v2_active_over_v1(tmp_path)
        for version in corrupt:
            (tmp_path / version / "weights.safetensors").write_bytes(b"flipped bits")
        loader = RecordingLoader()
        started = CheckpointRegistry(loader, VersionTable, tmp_path / "registry.json", tmp_path)
        await started.restore(previous=True)
        expected = "base" if "v1" in corrupt else "v1"
        assert started.active == expected and loader.events == [f"load {expected}"]
        assert started.fallback is not None and "v2" in started.fallback and expected in started.fallback
        assert all(started.table.checkpoints[v].state == "failed" for v in corrupt)
        assert "sha256" in (started.table.checkpoints["v2"].error or "")
        assert started.table.previous is None  # no rollback to a version that cannot load

    asyncio.run(scenario())


def test_a_corrupt_previous_checkpoint_at_start_only_loses_the_instant_rollback(tmp_path):
    async def scenario() -> None:
        await v2_active_over_v1(tmp_path)
        (tmp_path / "v1" / "weights.safetensors").write_bytes(b"flipped bits")
        started = CheckpointRegistry(RecordingLoader(), VersionTable, tmp_path / "registry.json", tmp_path)
        await started.restore(previous=True)
        assert (started.active, started.table.previous, started.fallback) == ("v2", None, None)
        assert started.table.checkpoints["v1"].state == "failed"

    asyncio.run(scenario())
