"""The policy's side of the checkpoint registry (`services.common.registry`): LoRA adapters, loaded into and
unloaded from the engine. `base` is the un-adapted model, always there."""

from __future__ import annotations

from pathlib import Path

from services.common.checkpoints import Manifest
from services.common.errors import InvalidRequest
from services.common.registry import CheckpointEntry, CheckpointRegistry, VersionTable, WeightsLoader
from services.policy.backends.engine import BASE_ADAPTER, Engine

ADAPTER_FILES = ("adapter_model.safetensors", "adapter_config.json")


class PolicyVersions(VersionTable):
    base_kind = "policy-base"


class AdapterLoader(WeightsLoader[str]):
    """A version's weights are its adapter, known to the engine by the version name."""

    noun = "policy"
    kinds = ("policy-lora",)
    always_loaded = frozenset({BASE_ADAPTER})

    def __init__(self, engine: Engine) -> None:
        self.engine = engine

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
            await self.engine.load_adapter(entry.version, folder)
        return entry.version

    async def unload(self, version: str, weights: str) -> None:
        if version != BASE_ADAPTER:
            await self.engine.unload_adapter(version)


def adapter_registry(engine: Engine, checkpoint_root: Path, state_path: Path) -> CheckpointRegistry[str]:
    return CheckpointRegistry(AdapterLoader(engine), PolicyVersions, state_path, checkpoint_root)
