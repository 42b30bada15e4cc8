import asyncio
import threading
from concurrent.futures import ThreadPoolExecutor

import pytest

from services.retriever.backends.batcher import MicroBatcher


def test_concurrent_calls_share_one_batch():
    calls: list[list[int]] = []
    sizes: list[int] = []
    gate = threading.Event()

    def run(key, items):
        gate.wait(5)
        calls.append(list(items))
        return [key * x for x in items]

    async def main():
        batcher = MicroBatcher(run, ThreadPoolExecutor(1), wait_s=0, on_batch=sizes.append)
        batcher.start()
        first = asyncio.create_task(batcher.submit(10, [1]))
        await asyncio.sleep(0.05)  # the first batch is running; the next three queue up behind it
        rest = [asyncio.create_task(batcher.submit(10, [i, i + 1])) for i in (2, 4, 6)]
        await asyncio.sleep(0.05)
        gate.set()
        results = [await first] + [await t for t in rest]
        await batcher.stop()
        return results

    results = asyncio.run(main())
    assert results == [[10], [20, 30], [40, 50], [60, 70]]
    assert calls == [[1], [2, 3, 4, 5, 6, 7]]
    assert sizes == [1, 6]  # what the service's bridge_retriever_batch_queries histogram observes


def test_errors_reach_every_caller():
    def run(key, items):
        raise RuntimeError("encoder failed")

    async def main():
        batcher = MicroBatcher(run, ThreadPoolExecutor(1), wait_s=0)
        batcher.start()
        results = await asyncio.gather(batcher.submit(1, [1]), batcher.submit(1, [2]), return_exceptions=True)
        await batcher.stop()
        return results

    assert all(isinstance(r, RuntimeError) for r in asyncio.run(main()))
    with pytest.raises(RuntimeError):
        raise asyncio.run(main())[0]


def _arrivals(wait_s: float, max_wait_s: float, spacing_s: float, count: int) -> list[int]:
    """Batch sizes when `count` single-item searches arrive `spacing_s` apart."""
    sizes: list[int] = []

    async def main():
        batcher = MicroBatcher(lambda key, items: items, ThreadPoolExecutor(1), wait_s=wait_s,
                               max_wait_s=max_wait_s, on_batch=sizes.append)  # fmt: skip
        batcher.start()
        tasks = []
        for i in range(count):
            tasks.append(asyncio.create_task(batcher.submit(0, [i])))
            await asyncio.sleep(spacing_s)
        assert [await t for t in tasks] == [[i] for i in range(count)]
        await batcher.stop()

    asyncio.run(main())
    return sizes


def test_a_batch_gathers_while_searches_keep_coming_up_to_its_cap():
    # Arrivals 50 ms apart, a 200 ms quiet gap: one batch for all, though the last came 350 ms after the first (a
    # fixed 200 ms window would have cut it in two).
    assert _arrivals(wait_s=0.2, max_wait_s=1.0, spacing_s=0.05, count=8) == [8]
    # The cap ends a gathering that would go on: arrivals 100 ms apart for 1 s, at most 300 ms a batch.
    sizes = _arrivals(wait_s=0.2, max_wait_s=0.3, spacing_s=0.1, count=10)
    assert sum(sizes) == 10 and len(sizes) >= 3 and max(sizes) <= 4
