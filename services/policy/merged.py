"""Serving a trained LoRA at base speed: merged into the weights, one weight set in the engine at a time.

vLLM's CPU LoRA path runs the adapter as extra matmuls on every token and served a trained checkpoint ~7x slower
than the base (0.4 vs 3 questions/s in evaluation). Merged, a checkpoint is a plain model: the same
kernels as the base. The cost moves to the swap: a version's merge is written once, when it is registered
(seconds for SmolLM2), and the engine reloads weights in place (`reload_weights`) when the version it serves
changes.

The hot-swap contract still holds with a single weight set, because `ServedWeights` decides when the engine may
change: a request enters on the version it leased; while it runs, the engine keeps that version's weights; a
request for another version waits until the running ones finish (and from then on, new requests for the old one
wait behind it, so a stream of them cannot starve it), then the engine swaps and it goes. Requests are delayed by
a swap, never failed. Opt-in (`BRIDGE_POLICY_ADAPTER_SERVING=merged`); LoRA serving (`adapters.py`) is the default
until a streamed-vs-plain log-prob gap seen after reloads is explained (docs/architecture.md).
"""

from __future__ import annotations

import asyncio
import logging
import shutil
from collections import Counter
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

from services.common.checkpoints import Manifest
from services.common.registry import BASE_VERSION, CheckpointEntry, CheckpointRegistry
from services.policy.adapters import AdapterLoader, PolicyVersions
from services.policy.backends.engine import BASE_ADAPTER, Engine

log = logging.getLogger(__name__)


def merge_adapter(base_dir: Path, adapter_dir: Path, out_dir: Path) -> Path:
    """Write base + LoRA (peft's merge, in fp32) to `out_dir` in the base's dtype; atomic (staging, rename)."""
    import torch
    from peft import PeftModel
    from transformers import AutoConfig, AutoModelForCausalLM

    dtype = AutoConfig.from_pretrained(str(base_dir)).dtype or torch.float32
    model = AutoModelForCausalLM.from_pretrained(str(base_dir), dtype=torch.float32)
    model = PeftModel.from_pretrained(model, str(adapter_dir)).merge_and_unload().to(dtype)
    staging = out_dir.with_name(out_dir.name + ".partial")
    shutil.rmtree(staging, ignore_errors=True)
    model.save_pretrained(str(staging), safe_serialization=True)
    shutil.rmtree(out_dir, ignore_errors=True)
    staging.replace(out_dir)
    return out_dir


class MergedLoader(AdapterLoader):
    """A version's weights are a folder of merged safetensors (the base model's folder for `base`), written when
    the version is registered or first loaded, and removed when the registry unloads it."""

    def __init__(self, engine: Engine, base_dir: Path, merged_root: Path) -> None:
        super().__init__(engine, merged_root / ".verified")
        self.base_dir = base_dir
        self.merged_root = merged_root

    async def load(  # type: ignore[override]
        self, registry: CheckpointRegistry[Path], entry: CheckpointEntry, folder: Path | None, manifest: Manifest | None
    ) -> Path:
        if folder is None:
            return self.base_dir
        out = self.merged_root / entry.version
        # Re-merged on every load, from the copy hashed as it was made (the merged folder is not hashed).
        adapter = await self.verified(entry.version, folder, manifest)
        try:
            return await asyncio.to_thread(merge_adapter, self.base_dir, adapter, out)
        finally:
            await asyncio.to_thread(shutil.rmtree, adapter, True)

    async def unload(self, version: str, weights: Path) -> None:  # type: ignore[override]
        if version != BASE_VERSION:
            await asyncio.to_thread(shutil.rmtree, weights, True)


def merged_registry(
    engine: Engine, base_dir: Path, merged_root: Path, checkpoint_root: Path, state_path: Path
) -> CheckpointRegistry[Path]:
    return CheckpointRegistry(MergedLoader(engine, base_dir, merged_root), PolicyVersions, state_path, checkpoint_root)


class ServedWeights:
    """Which version's weights the engine holds, and the rule for changing them (see the module doc)."""

    def __init__(self, engine: Engine, base_dir: Path) -> None:
        self.engine = engine
        self.served, self._served_weights = BASE_VERSION, base_dir  # what the engine starts with
        self.swaps = 0
        self._running = 0  # requests now generating on `served`
        self._waiting: Counter[str] = Counter()
        self._changed = asyncio.Condition()

    def _may_enter(self, version: str) -> bool:
        if version == self.served:
            return not any(n for v, n in self._waiting.items() if v != version)
        return self._running == 0

    @asynccontextmanager
    async def serving(self, version: str, weights: Path) -> AsyncIterator[str]:
        """Hold the engine on `version` (its weights in `weights`) for one request; yields the engine's model name."""
        async with self._changed:
            self._waiting[version] += 1
            try:
                await self._changed.wait_for(lambda: self._may_enter(version))
                if version != self.served:  # nothing runs now: swap (others wait on the condition meanwhile)
                    await self._swap(version, weights)
                self._running += 1
            finally:
                self._waiting[version] -= 1
                if self._waiting[version] <= 0:
                    del self._waiting[version]
                self._changed.notify_all()
        try:
            yield BASE_ADAPTER
        finally:
            async with self._changed:
                self._running -= 1
                self._changed.notify_all()

    async def _swap(self, version: str, weights: Path) -> None:
        try:
            await self.engine.swap_weights(weights)
        except Exception:
            # A reload that failed half-way leaves unknown weights: put the served version's back before failing
            # this request, so the others still get what they asked for.
            log.exception("engine weights: loading %s failed; reloading %s", version, self.served)
            await self.engine.swap_weights(self._served_weights)
            raise
        log.info("engine weights: %s -> %s", self.served, version)
        self.served, self._served_weights, self.swaps = version, weights, self.swaps + 1


class AdapterPerRequest:
    """LoRA serving: every version is loaded in the engine at once; a request names its adapter."""

    @asynccontextmanager
    async def serving(self, version: str, weights: str) -> AsyncIterator[str]:
        yield weights
