"""The policy's side of the checkpoint registry (`services.common.registry`): LoRA adapters, loaded into and
unloaded from the engine. `base` is the un-adapted model, always there."""

from __future__ import annotations

import asyncio
import json
import shutil
from pathlib import Path

from safetensors import SafetensorError, safe_open

from services.common.checkpoints import Manifest, copy_verified
from services.common.errors import InvalidRequest
from services.common.registry import CheckpointEntry, CheckpointRegistry, VersionTable, WeightsLoader
from services.modeling.shipped import ADAPTER_FILES
from services.policy.backends.engine import BASE_ADAPTER, Engine


def check_adapter_files(folder: Path) -> None:
    """Refuse (400 with the reason) an adapter whose hashed files are not what they claim: the weights must be a
    safetensors file (its header read, nothing loaded) and the config a JSON object. Without this a payload that
    matches its manifest but is no adapter fails inside the engine, a 500 or vLLM's own refusal."""
    weights, config = (folder / name for name in ADAPTER_FILES)
    try:
        with safe_open(str(weights), framework="numpy") as handle:
            handle.keys()
    except (SafetensorError, OSError) as exc:
        raise InvalidRequest(f"{weights.name} is not a safetensors file: {exc}", param="path",
                             code="invalid_checkpoint") from exc  # fmt: skip
    try:
        parsed = json.loads(config.read_text())
    except (ValueError, OSError) as exc:
        raise InvalidRequest(f"{config.name} is not JSON: {exc}", param="path", code="invalid_checkpoint") from exc
    if not isinstance(parsed, dict):
        raise InvalidRequest(f"{config.name} is not a JSON object", param="path", code="invalid_checkpoint")


class PolicyVersions(VersionTable):
    base_kind = "policy-base"


class AdapterLoader(WeightsLoader[str]):
    """A version's weights are its adapter, known to the engine by the version name."""

    noun = "policy"
    kinds = ("policy-lora",)
    always_loaded = frozenset({BASE_ADAPTER})

    def __init__(self, engine: Engine, verified_root: Path) -> None:
        self.engine = engine
        self.verified_root = verified_root  # the engine reads these copies, never the checkpoint root

    async def verified(self, version: str, folder: Path, manifest: Manifest | None) -> Path:
        """The adapter as it was verified: a private copy, hashed as it is made, that the engine then reads."""
        if manifest is None:
            raise ValueError(f"{version}: an adapter folder without its verified manifest")
        copy = await asyncio.to_thread(copy_verified, folder, manifest, self.verified_root / version)
        check_adapter_files(copy)
        return copy

    def check(self, manifest: Manifest) -> None:
        missing = [f for f in ADAPTER_FILES if f not in manifest.files]
        if missing:
            raise InvalidRequest(f"a policy-lora checkpoint needs {missing}", param="path")
        if manifest.version == BASE_ADAPTER:
            raise InvalidRequest("'base' is reserved for the un-adapted model", param="path")

    async def load(
        self, registry: CheckpointRegistry[str], entry: CheckpointEntry, folder: Path | None, manifest: Manifest | None
    ) -> str:
        if folder is not None:  # None: the base model, always in the engine
            await self.engine.load_adapter(entry.version, await self.verified(entry.version, folder, manifest))
        return entry.version

    async def unload(self, version: str, weights: str) -> None:
        if version != BASE_ADAPTER:
            await self.engine.unload_adapter(version)
            shutil.rmtree(self.verified_root / version, ignore_errors=True)


def adapter_registry(engine: Engine, checkpoint_root: Path, state_path: Path) -> CheckpointRegistry[str]:
    """`<state dir>/verified/`: the private copies the engine loads (a vLLM of its own reads this service's disk)."""
    loader = AdapterLoader(engine, state_path.parent / "verified")
    return CheckpointRegistry(loader, PolicyVersions, state_path, checkpoint_root)
