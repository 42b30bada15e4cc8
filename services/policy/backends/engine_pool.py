"""Several engine copies behind the one Engine interface: data parallelism for the policy service.

A generation goes to the copy with the fewest generations in flight (the first such copy in order, so a quiet
service uses copy 0). What changes the served model changes every copy before it returns: an adapter is loaded
into all of them (a copy that refuses it is a refusal of the whole load, and the copies that took it drop it), and
merged weights are reloaded in all of them. The checkpoint registry commits a version only after its load returns,
so no request is served at a version before every copy has it, and a pinned version is on whichever copy takes the
request.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Iterator, Sequence
from pathlib import Path

from services.policy.backends.engine import Engine, EngineError, Generation, SamplingSpec


class EnginePool(Engine):
    def __init__(self, engines: Sequence[Engine]) -> None:
        if not engines:
            raise ValueError("an engine pool needs at least one engine")
        self.engines = list(engines)
        self.tokenizer = self.engines[0].tokenizer
        self.in_flight = [0] * len(self.engines)
        self.served = [0] * len(self.engines)  # generations each copy took (the load spread, for tests and logs)

    async def start(self) -> None:
        # A copy that compiles starts alone and fills the shared compile cache; the rest then start at once and load
        # it. Copies that do not compile (BRIDGE_POLICY_VLLM_ENFORCE_EAGER, the transformers engine) all start at once.
        first = 1 if self.engines[0].compiles else 0
        for group in (self.engines[:first], self.engines[first:]):
            results = await asyncio.gather(*(engine.start() for engine in group), return_exceptions=True)
            failed = next((r for r in results if isinstance(r, BaseException)), None)
            if failed is not None:
                await self.stop()  # every copy, started or not (stop is a no-op on one that never started)
                raise failed

    async def stop(self) -> None:
        await asyncio.gather(*(engine.stop() for engine in self.engines), return_exceptions=True)

    @contextlib.contextmanager
    def _least_loaded(self) -> Iterator[Engine]:
        n = min(range(len(self.engines)), key=lambda i: self.in_flight[i])
        self.in_flight[n] += 1
        self.served[n] += 1
        try:
            yield self.engines[n]
        finally:
            self.in_flight[n] -= 1

    async def generate(self, prompt_ids: list[int], spec: SamplingSpec, adapter: str) -> Generation:
        with self._least_loaded() as engine:
            return await engine.generate(prompt_ids, spec, adapter)

    async def generate_streaming(
        self, prompt_ids: list[int], spec: SamplingSpec, adapter: str, on_text: Callable[[str], None]
    ) -> Generation:
        with self._least_loaded() as engine:
            return await engine.generate_streaming(prompt_ids, spec, adapter, on_text)

    async def healthy(self) -> bool:
        return all(await asyncio.gather(*(engine.healthy() for engine in self.engines)))

    async def _on_all(self, change: Callable[[Engine], Awaitable[None]], undo: Callable[[Engine], Awaitable[None]],
                      what: str) -> None:  # fmt: skip
        results = await asyncio.gather(*(change(engine) for engine in self.engines), return_exceptions=True)
        failed = [(n, r) for n, r in enumerate(results) if isinstance(r, BaseException)]
        if failed:
            for engine, result in zip(self.engines, results, strict=True):
                if not isinstance(result, BaseException):
                    with contextlib.suppress(Exception):
                        await undo(engine)
            reasons = "; ".join(f"engine {n}: {r}" for n, r in failed)
            raise EngineError(f"{what} failed on {len(failed)} of {len(self.engines)} engines: {reasons}")

    async def load_adapter(self, name: str, path: Path) -> None:
        await self._on_all(lambda e: e.load_adapter(name, path), lambda e: e.unload_adapter(name),
                           f"loading adapter {name}")  # fmt: skip

    async def unload_adapter(self, name: str) -> None:
        results = await asyncio.gather(*(e.unload_adapter(name) for e in self.engines), return_exceptions=True)
        failed = [f"engine {n}: {r}" for n, r in enumerate(results) if isinstance(r, BaseException)]
        if failed:
            raise EngineError(f"unloading adapter {name} failed: {'; '.join(failed)}")

    async def swap_weights(self, folder: Path) -> None:
        """Every copy reloads; when one fails the caller (ServedWeights) reloads the weights it served, on all."""
        results = await asyncio.gather(*(e.swap_weights(folder) for e in self.engines), return_exceptions=True)
        failed = [f"engine {n}: {r}" for n, r in enumerate(results) if isinstance(r, BaseException)]
        if failed:
            raise EngineError(f"reloading weights from {folder} failed: {'; '.join(failed)}")
