"""ServedWeights: the engine holds one version's weights; requests never see a swap under them."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from services.policy.backends.engine import EngineError
from services.policy.merged import ServedWeights


class RecordingEngine:
    """Stands in for vLLM's weight reload: records what was loaded and which requests ran meanwhile."""

    def __init__(self, fail_on: Path | None = None) -> None:
        self.loaded: list[Path] = []
        self.fail_on = fail_on
        self.running = 0
        self.swapped_while_running = False

    async def swap_weights(self, folder: Path) -> None:
        self.swapped_while_running |= self.running > 0
        await asyncio.sleep(0.01)
        self.loaded.append(folder)
        if folder == self.fail_on:
            raise EngineError("reload failed")


async def request(weights: ServedWeights, engine: RecordingEngine, version: str, log: list, hold: float) -> None:
    async with weights.serving(version, Path(version)) as name:
        assert name == "base"  # the engine serves one model name whatever the version
        engine.running += 1
        log.append((version, weights.served))
        await asyncio.sleep(hold)
        assert weights.served == version  # no swap under a running request
        engine.running -= 1


def test_requests_on_the_served_version_share_it_without_a_swap():
    async def main():
        engine = RecordingEngine()
        weights = ServedWeights(engine, Path("base"))
        log: list = []
        await asyncio.gather(*(request(weights, engine, "base", log, 0.01) for _ in range(5)))
        return engine, weights

    engine, weights = asyncio.run(main())
    assert engine.loaded == [] and weights.swaps == 0


def test_a_new_version_waits_for_running_requests_and_later_ones_queue_behind_it():
    async def main():
        engine = RecordingEngine()
        weights = ServedWeights(engine, Path("base"))
        log: list = []
        old = [asyncio.create_task(request(weights, engine, "base", log, 0.05)) for _ in range(3)]
        await asyncio.sleep(0.01)
        new = asyncio.create_task(request(weights, engine, "v1", log, 0.02))
        await asyncio.sleep(0.01)
        late = asyncio.create_task(request(weights, engine, "base", log, 0.0))  # pinned to the old version
        await asyncio.gather(*old, new, late)
        return engine, weights, log

    engine, weights, log = asyncio.run(main())
    assert not engine.swapped_while_running
    assert [v for v, _ in log] == ["base"] * 3 + ["v1", "base"]  # the late base request went after v1
    assert all(version == served for version, served in log)
    assert engine.loaded == [Path("v1"), Path("base")] and weights.swaps == 2


def test_a_failed_reload_fails_only_its_request_and_restores_the_served_weights():
    async def main():
        engine = RecordingEngine(fail_on=Path("broken"))
        weights = ServedWeights(engine, Path("base"))
        log: list = []
        with pytest.raises(EngineError):
            await request(weights, engine, "broken", log, 0.0)
        await request(weights, engine, "base", log, 0.0)
        return engine, weights, log

    engine, weights, log = asyncio.run(main())
    assert engine.loaded == [Path("broken"), Path("base")]  # the failed load, then the served weights again
    assert weights.served == "base" and weights.swaps == 0 and log == [("base", "base")]
