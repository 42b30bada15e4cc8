"""One checkpoint registry for every service that hot-swaps weights. The rules live here; a service plugs in a
`WeightsLoader` that knows only how its kind of weights loads, unloads and (if it must) gets ready to serve.

- **register**: the manifest is verified first (sha256 of every file, `load_manifest`) and its kind must be one the
  service serves. The same version from the same folder again is a no-op; from another folder it is a 409. Weights
  that do not load are refused before the version is registered.
- **activate**: an unknown version is a 404; a version whose preparation failed is a 409 with the reason; while one
  version is being prepared every activation is a 409. A ready version becomes active at once (the previous active
  one becomes `previous`); one that is not ready (a retriever document tower whose collection is not built) is
  prepared in the background first, then activated.
- **rollback**: activate `previous`; a 409 when there is none.
- **drain**: a request leases the version it starts on and finishes on it; activation only changes what new
  requests get. Weights that are neither active, previous, pending nor leased are unloaded once their last
  request finishes, except the `keep_pinned` versions requests pinned most recently (so a client that pins one
  version does not load and sha-check it on every request).

The table (`VersionTable`) is one JSON file replaced atomically. No torch here.
"""

from __future__ import annotations

import asyncio
import logging
from abc import ABC, abstractmethod
from collections import Counter, OrderedDict
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import ClassVar, Generic, TypeVar

from pydantic import BaseModel, Field

from services.common.checkpoints import Manifest, load_manifest, remove_leftovers, write_json_atomic
from services.common.errors import BridgeError, Conflict, InvalidRequest, NotFound
from services.common.schemas.checkpoints import ActivationResponse, CheckpointInfo, CheckpointList, CheckpointState

log = logging.getLogger(__name__)
BASE_VERSION = "base"
W = TypeVar("W")  # a service's loaded weights (the retriever's encoder pair, the policy's adapter name)


class CheckpointEntry(BaseModel):
    version: str
    kind: str
    parent: str | None = None
    created_at: str | None = None
    path: str | None = Field(None, description="Checkpoint folder; None for the base weights.")
    state: CheckpointState = Field("ready", description="pending/embedding/ready/failed: whether it can serve.")
    error: str | None = Field(None, description="Why its preparation failed (state 'failed').")


class VersionTable(BaseModel):
    """The registry file: every registered version, the active one and the one before it."""

    base_kind: ClassVar[str] = "base"

    active: str = BASE_VERSION
    previous: str | None = None
    checkpoints: dict[str, CheckpointEntry] = Field(default_factory=dict)

    def sharing(self, version: str) -> list[CheckpointEntry]:
        """The checkpoints whose state moves with `version`'s (a service may group them; here, only itself)."""
        return [self.checkpoints[version]]

    @classmethod
    def fresh(cls) -> VersionTable:
        table = cls()
        table.checkpoints[BASE_VERSION] = CheckpointEntry(version=BASE_VERSION, kind=cls.base_kind)
        return table

    @classmethod
    def load(cls, path: Path) -> VersionTable:
        table = cls.model_validate_json(path.read_text()) if path.exists() else cls.fresh()
        for entry in table.checkpoints.values():
            if entry.state == "embedding":  # a preparation this process's predecessor did not finish
                entry.state = "pending"
        return table

    def save(self, path: Path) -> None:
        write_json_atomic(path, self.model_dump(mode="json"))


class WeightsLoader(ABC, Generic[W]):
    """What a service plugs into `CheckpointRegistry`: how its kind of weights loads and unloads."""

    noun: ClassVar[str]  # "retriever", "policy": in error messages
    kinds: ClassVar[tuple[str, ...]]  # the manifest kinds it serves
    always_loaded: ClassVar[frozenset[str]] = frozenset()  # never unloaded (weights that cost nothing to hold)
    keep_registered: ClassVar[bool] = False  # keep a registered version's weights loaded until the next activation
    # For a loader whose versions may need preparing before they serve (`is_ready`, `prepare`):
    preparing_status: ClassVar[str] = "preparing"  # ActivationResponse.status meanwhile
    preparing: ClassVar[str] = "being prepared"  # "version X is still <preparing>"
    preparation_failed: ClassVar[str] = "preparing it failed"  # "cannot serve: <preparation_failed>: <error>"

    def check(self, manifest: Manifest) -> None:
        """Refuse a verified manifest this service cannot serve (InvalidRequest); called before anything loads."""

    def entry_for(
        self, registry: CheckpointRegistry[W], folder: Path, manifest: Manifest, *, strict_lineage: bool
    ) -> CheckpointEntry:
        """The table row for a new version (the registry lock is held)."""
        return CheckpointEntry(
            version=manifest.version,
            kind=manifest.kind,
            parent=manifest.parent,
            created_at=manifest.created_at,
            path=str(folder),
        )

    @abstractmethod
    async def load(
        self, registry: CheckpointRegistry[W], entry: CheckpointEntry, folder: Path | None, manifest: Manifest | None
    ) -> W:
        """Load a version's weights (`folder` None: the base weights). The registry lock is held, so this may call
        `registry.load` for another version. Raise InvalidRequest for weights that cannot serve."""

    async def unload(self, version: str, weights: W) -> None:
        """Free a version's weights; no request uses them any more."""

    async def activated(self, registry: CheckpointRegistry[W], version: str, weights: W) -> None:
        """`version` is about to serve (at start, or on activation); the registry lock is held."""

    def is_ready(self, registry: CheckpointRegistry[W], version: str) -> bool:
        """Whether `version` can serve at once; if not, activating it runs `prepare` first."""
        return True

    async def prepare(self, registry: CheckpointRegistry[W], version: str, weights: W) -> None:
        """Make `version` ready to serve (runs in the background, without the lock); raise to fail it."""
        raise NotImplementedError(f"{self.noun} versions need no preparation")

    async def abandon(self, registry: CheckpointRegistry[W], version: str) -> None:
        """`prepare` failed for `version`: free what it half built (the registry lock is held; do not raise)."""


class CheckpointRegistry(Generic[W]):
    """Register / activate / rollback / lease-and-drain, over one `VersionTable` file and a `WeightsLoader`."""

    def __init__(
        self,
        loader: WeightsLoader[W],
        table_type: type[VersionTable],
        state_path: Path,
        checkpoint_root: Path,
        *,
        keep_pinned: int = 0,
    ) -> None:
        """`keep_pinned`: how many versions that requests pin (not the active one) stay loaded after their
        request, the least recently pinned dropped first; 0: each is unloaded when its last request finishes."""
        self.loader = loader
        self.state_path = state_path
        self.checkpoint_root = checkpoint_root
        self.table = table_type.load(state_path)
        self.pending: str | None = None  # the version being prepared
        self._loaded: dict[str, W] = {}
        self._in_flight: Counter[str] = Counter()
        self._kept: set[str] = set()  # registered since the last activation (when the loader keeps them)
        self.keep_pinned = keep_pinned
        self._pinned: OrderedDict[str, None] = OrderedDict()  # recently pinned versions, least recent first
        self._lock = asyncio.Lock()  # one checkpoint change at a time
        self._preparation: asyncio.Task | None = None
        self.fallback: str | None = None  # why start serves a version other than the recorded active one

    # ---------------------------------------------------------------- lifecycle
    async def restore(self, *, previous: bool) -> None:
        """At start: clear what an interrupted publish left in the checkpoint root, load the active version (and the
        previous one, for an instant rollback) and serve it."""
        if removed := await asyncio.to_thread(remove_leftovers, self.checkpoint_root):
            log.warning("removed what interrupted checkpoint writes left in %s: %s", self.checkpoint_root, removed)
        async with self._lock:
            wanted = self.table.active
            for version in dict.fromkeys([wanted, self.table.previous, BASE_VERSION]):
                if version is None:
                    continue
                if (error := await self._try_load(version)) is None:
                    break
                self._set_state(version, "failed", error)
            else:
                raise RuntimeError(f"no {self.loader.noun} version can load, not even {BASE_VERSION}: {error}")
            if version != wanted:  # never a crash loop on a bad disk: serve the last good version, and say so
                self.fallback = f"active version {wanted} could not load at start; serving {version} instead"
                log.error("%s: %s", self.loader.noun, self.fallback)
                self.table.previous, self.table.active = None, version
            if previous and self.table.previous not in (None, version):
                if error := await self._try_load(self.table.previous):  # no instant rollback to it, but it serves
                    log.error("%s previous version %s could not load at start: %s", self.loader.noun,
                              self.table.previous, error)  # fmt: skip
                    self._set_state(self.table.previous, "failed", error)
                    self.table.previous = None
            await self.loader.activated(self, self.table.active, self._loaded[self.table.active])
            self._set_state(self.table.active, "ready")
            self._save()

    async def _try_load(self, version: str) -> str | None:
        """Load `version` at start; None when it loaded, else why not (a corrupt, missing or refused checkpoint)."""
        try:
            await self.load(version)
        except (BridgeError, OSError, ValueError) as exc:
            return str(exc)
        return None

    async def close(self, timeout: float = 60) -> None:
        """Give a preparation still running `timeout` seconds to finish."""
        if self._preparation is not None and not self._preparation.done():
            await asyncio.wait({self._preparation}, timeout=timeout)

    # ---------------------------------------------------------------- serving
    @property
    def active(self) -> str:
        return self.table.active

    def weights(self, version: str) -> W:
        """Loaded weights: the active version's always, a leased version's while it is leased."""
        return self._loaded[version]

    def check_registered(self, version: str) -> None:
        """A version a request pins by its `model`: unknown is a 404 on that parameter."""
        if version not in self.table.checkpoints:
            raise NotFound(
                f"{self.loader.noun} version {version!r} is not registered", param="model", code="model_not_found"
            )

    @asynccontextmanager
    async def lease(self, version: str | None = None) -> AsyncIterator[str]:
        """Pin the active version (or `version`, from a request's `model`: any registered one, loaded for the request
        if it is not) until the request finishes."""
        pinned = version is not None
        if version is not None:
            self.check_registered(version)
        version = version or self.table.active
        self._in_flight[version] += 1
        try:
            if version not in self._loaded:
                async with self._lock:
                    await self.load(version)
            if pinned:
                self._remember_pinned(version)
            yield version
        finally:
            self._in_flight[version] -= 1
            if self._in_flight[version] <= 0:
                del self._in_flight[version]
                await self._drain()

    async def load(self, version: str) -> W:
        """A registered version's weights, loaded (files re-verified) when they are not; callers hold the lock."""
        if version in self._loaded:
            return self._loaded[version]
        entry = self.table.checkpoints[version]
        folder, manifest = None, None
        if entry.path is not None:  # sha256 re-checked on every load
            folder, manifest = await asyncio.to_thread(load_manifest, self.checkpoint_root, entry.path)
        weights = await self.loader.load(self, entry, folder, manifest)
        self._loaded[version] = weights
        return weights

    def _remember_pinned(self, version: str) -> None:
        """Keep a loaded pinned version for the next request that pins it, at most `keep_pinned` of them: the least
        recently pinned one goes (`_drain` unloads it once no request uses it)."""
        if self.keep_pinned <= 0 or version == self.table.active:  # the active version stays loaded anyway
            return
        self._pinned[version] = None
        self._pinned.move_to_end(version)
        while len(self._pinned) > self.keep_pinned:
            self._pinned.popitem(last=False)

    async def _drain(self) -> None:
        keep = {self.table.active, self.table.previous, self.pending, *self._kept, *self._pinned,
                *self.loader.always_loaded}  # fmt: skip
        for version in list(self._loaded):
            if version not in keep and self._in_flight[version] == 0:
                await self.loader.unload(version, self._loaded.pop(version))

    # ---------------------------------------------------------------- changes
    async def register(self, path: str, *, strict_lineage: bool = False) -> Manifest:
        folder, manifest = await asyncio.to_thread(load_manifest, self.checkpoint_root, path)
        if manifest.kind not in self.loader.kinds:
            raise InvalidRequest(f"a {manifest.kind} checkpoint is not a {self.loader.noun} checkpoint", param="path")
        self.loader.check(manifest)
        async with self._lock:
            existing = self.table.checkpoints.get(manifest.version)
            if existing is not None:
                if existing.path is not None and Path(existing.path) == folder:
                    return manifest
                raise Conflict(f"version {manifest.version} is already registered", param="path")
            entry = self.loader.entry_for(self, folder, manifest, strict_lineage=strict_lineage)
            # Load it now: weights that do not load never get registered.
            self._loaded[manifest.version] = await self.loader.load(self, entry, folder, manifest)
            self.table.checkpoints[manifest.version] = entry
            self._save()
            if self.loader.keep_registered:
                self._kept.add(manifest.version)
        await self._drain()
        return manifest

    async def activate(self, version: str) -> ActivationResponse:
        async with self._lock:
            if version not in self.table.checkpoints:
                raise NotFound(f"{self.loader.noun} version {version!r} is not registered", param="version")
            entry = self.table.checkpoints[version]
            if entry.state == "failed":
                raise Conflict(
                    f"{self.loader.noun} version {version} cannot serve: {self.loader.preparation_failed}: "
                    f"{entry.error}",
                    param="version",
                )
            if self.pending is not None:
                raise Conflict(f"version {self.pending} is still {self.loader.preparing}; try again later")
            if version != self.table.active:
                if self.loader.is_ready(self, version):
                    await self._flip(version)
                else:
                    await self._start_preparing(version)
            response = self._activation_response()
        await self._drain()
        return response

    async def rollback(self) -> ActivationResponse:
        if self.table.previous is None:
            raise Conflict("there is no previous version to roll back to")
        return await self.activate(self.table.previous)

    # ---------------------------------------------------------------- two-phase (services.common.replicas)
    async def make_ready(self, version: str) -> None:
        """Load `version` and prepare it to serve (a re-embed where its loader needs one), without making it
        active: the first phase of a swap that several replicas commit together. Raises why it cannot serve."""
        async with self._lock:
            if version not in self.table.checkpoints:
                raise NotFound(f"{self.loader.noun} version {version!r} is not registered", param="version")
            weights = await self.load(version)
            if self.loader.is_ready(self, version):
                self._kept.add(version)  # loaded for the commit: not drained before it
                return
            if self.pending is not None:
                raise Conflict(f"version {self.pending} is still {self.loader.preparing}; try again later")
            self._set_state(version, "embedding")
            self._save()
            self.pending = version
        try:
            await self.loader.prepare(self, version, weights)
        except Exception as exc:
            async with self._lock:
                await self.loader.abandon(self, version)
                self._set_state(version, "failed", f"{type(exc).__name__}: {exc}"[:2000])
                self._save()
            raise
        finally:
            self.pending = None
        async with self._lock:
            self._set_state(version, "ready")
            self._kept.add(version)
            self._save()

    async def commit(self, version: str) -> None:
        """The second phase: `version` (made ready) is what new requests get from here on."""
        async with self._lock:
            if version != self.table.active:
                await self._flip(version)
        await self._drain()

    def listing(self) -> CheckpointList:
        return CheckpointList(
            active=self.table.active,
            previous=self.table.previous,
            pending=self.pending,
            checkpoints=[
                CheckpointInfo.model_validate(c, from_attributes=True) for c in self.table.checkpoints.values()
            ],
        )

    def _activation_response(self) -> ActivationResponse:
        status = "active" if self.pending is None else self.loader.preparing_status
        return ActivationResponse(
            active=self.table.active, previous=self.table.previous, pending=self.pending, status=status
        )

    async def _flip(self, version: str) -> None:
        """Make `version` what new requests get; callers hold the lock."""
        weights = await self.load(version)
        await self.loader.activated(self, version, weights)
        previous = self.table.active
        self.table.previous, self.table.active = previous, version  # requests that start from here on get `version`
        self._save()
        self._kept.clear()
        log.info("%s version %s active (previous %s)", self.loader.noun, version, previous)

    # ---------------------------------------------------------------- preparation
    async def _start_preparing(self, version: str) -> None:
        weights = await self.load(version)
        self._set_state(version, "embedding")
        self._save()
        self.pending = version
        self._preparation = asyncio.create_task(self._prepare(version, weights))

    async def _prepare(self, version: str, weights: W) -> None:
        """Prepare, then activate. On failure the active version is unchanged and the checkpoint's state is 'failed'
        with the reason."""
        try:
            await self.loader.prepare(self, version, weights)
            async with self._lock:
                self._set_state(version, "ready")
                await self._flip(version)
        except Exception as exc:
            if self.table.active == version:  # it went live; only recording that failed
                log.exception("%s version %s is active, but saving the registry failed", self.loader.noun, version)
                return
            log.exception("preparing %s version %s failed; the active version is unchanged", self.loader.noun, version)
            async with self._lock:
                await self.loader.abandon(self, version)
                self._set_state(version, "failed", f"{type(exc).__name__}: {exc}"[:2000])
                self._save()
        finally:
            self.pending = None
        await self._drain()

    def _set_state(self, version: str, state: CheckpointState, error: str | None = None) -> None:
        """For `version` and every checkpoint whose state moves with it; callers hold the lock and save."""
        for entry in self.table.sharing(version):
            entry.error = error
            entry.state = state

    def _save(self) -> None:
        self.table.save(self.state_path)
