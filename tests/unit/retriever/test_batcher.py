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
