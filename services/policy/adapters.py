"""Policy versions: `base` and registered LoRA adapters, with activation that drains in-flight requests.

A request pins the active version when it starts (`lease`); activation only changes what new requests
get. An adapter that is neither active nor previous is unloaded from the engine once its last request
finishes; the previous one stays loaded for an instant rollback.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

from pydantic import BaseModel, Field

from services.common.checkpoints import Manifest, load_manifest, write_json_atomic
from services.common.errors import Conflict, InvalidRequest, NotFound
from services.common.schemas.checkpoints import ActivationResponse, CheckpointInfo, CheckpointList
from services.policy.backends.engine import BASE_ADAPTER, Engine

ADAPTER_FILES = ("adapter_model.safetensors", "adapter_config.json")


class PolicyCheckpoint(BaseModel):
    version: str
    kind: str
    parent: str | None = None
    created_at: str | None = None
    path: str | None = None


class PolicyRegistry(BaseModel):
    active: str = BASE_ADAPTER
    previous: str | None = None
    checkpoints: dict[str, PolicyCheckpoint] = Field(
        default_factory=lambda: {BASE_ADAPTER: PolicyCheckpoint(version=BASE_ADAPTER, kind="policy-base")}
    )


class AdapterManager:
    def __init__(self, engine: Engine, checkpoint_root: Path, state_path: Path) -> None:
        self.engine = engine
        self.checkpoint_root = checkpoint_root
        self.state_path = state_path
        self.registry = (
            PolicyRegistry.model_validate_json(state_path.read_text()) if state_path.exists() else PolicyRegistry()
        )
        self._in_flight: Counter[str] = Counter()
        self._loaded: set[str] = set()
        self._lock = asyncio.Lock()

    async def restore(self) -> None:
        """After a restart, put the active and previous adapters back into the engine."""
        for version in (self.registry.active, self.registry.previous):
            if version and version != BASE_ADAPTER:
                await self._ensure_loaded(version)

    @property
    def active(self) -> str:
        return self.registry.active

    @asynccontextmanager
    async def lease(self, version: str | None = None) -> AsyncIterator[str]:
        """Pin the active version (or `version`, any registered one, loaded for the request if it is not)."""
        if version is not None:
            self.check_registered(version)
        version = version or self.registry.active
        self._in_flight[version] += 1
        try:
            if version != BASE_ADAPTER and version not in self._loaded:
                async with self._lock:
                    await self._ensure_loaded(version)
            yield version
        finally:
            self._in_flight[version] -= 1
            if self._in_flight[version] <= 0:
                del self._in_flight[version]
                await self._unload_idle()

    def check_registered(self, version: str) -> None:
        if version not in self.registry.checkpoints:
            raise NotFound(f"policy version {version!r} is not registered", param="model", code="model_not_found")

    async def _ensure_loaded(self, version: str) -> None:
        if version == BASE_ADAPTER or version in self._loaded:
            return
        entry = self.registry.checkpoints[version]
        folder, _ = load_manifest(self.checkpoint_root, entry.path)  # sha256 re-checked on every load
        await self.engine.load_adapter(version, folder)
        self._loaded.add(version)

    async def _unload_idle(self) -> None:
        keep = {self.registry.active, self.registry.previous, BASE_ADAPTER}
        for version in list(self._loaded):
            if version not in keep and self._in_flight[version] == 0:
                self._loaded.discard(version)
                await self.engine.unload_adapter(version)

    def _save(self) -> None:
        write_json_atomic(self.state_path, self.registry.model_dump(mode="json"))

    async def register(self, path: str) -> Manifest:
        folder, manifest = await asyncio.to_thread(load_manifest, self.checkpoint_root, path)
        if manifest.kind != "policy-lora":
            raise InvalidRequest(f"a {manifest.kind} checkpoint is not a policy checkpoint", param="path")
        missing = [f for f in ADAPTER_FILES if f not in manifest.files]
        if missing:
            raise InvalidRequest(f"a policy-lora checkpoint needs {missing}", param="path")
        if manifest.version == BASE_ADAPTER:
            raise InvalidRequest("'base' is reserved for the un-adapted model", param="path")
        async with self._lock:
            existing = self.registry.checkpoints.get(manifest.version)
            if existing is not None:
                if existing.path == str(folder):
                    return manifest
                raise Conflict(f"version {manifest.version} is already registered", param="path")
            # Load it now: an adapter the engine refuses never gets registered.
            await self.engine.load_adapter(manifest.version, folder)
            self._loaded.add(manifest.version)
            self.registry.checkpoints[manifest.version] = PolicyCheckpoint(
                version=manifest.version,
                kind=manifest.kind,
                parent=manifest.parent,
                created_at=manifest.created_at,
                path=str(folder),
            )
            self._save()
        await self._unload_idle()
        return manifest

    async def activate(self, version: str) -> ActivationResponse:
        async with self._lock:
            if version not in self.registry.checkpoints:
                raise NotFound(f"policy version {version!r} is not registered", param="version")
            if version != self.registry.active:
                await self._ensure_loaded(version)
                self.registry.previous, self.registry.active = self.registry.active, version
                self._save()
        await self._unload_idle()
        return ActivationResponse(active=self.registry.active, previous=self.registry.previous, status="active")

    async def rollback(self) -> ActivationResponse:
        if self.registry.previous is None:
            raise Conflict("there is no previous version to roll back to")
        return await self.activate(self.registry.previous)

    def listing(self) -> CheckpointList:
        return CheckpointList(
            active=self.registry.active,
            previous=self.registry.previous,
            checkpoints=[
                CheckpointInfo(version=c.version, kind=c.kind, parent=c.parent, created_at=c.created_at)
                for c in self.registry.checkpoints.values()
            ],
        )
