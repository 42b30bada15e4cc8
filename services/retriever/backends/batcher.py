"""Gathers concurrent search calls into one encoder forward and one index query batch.

Requests that arrive while a batch runs wait in the queue and go together in the next one, so throughput
grows with concurrency instead of each request paying its own forward pass. After the first request, a batch keeps
gathering while requests keep coming less than `wait_s` apart, up to `max_wait_s`: with a fixed short window, 8
clients settled into two cohorts of ~4 that alternated (one cohort's forward ran while the other's answers went
out and its next requests came in), each forward half as full as it could be (`bridge_retriever_batch_queries`:
3.9 queries a forward with 8 clients; docs/performance.md). One client still waits only `wait_s`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any


@dataclass
class _Job:
    key: Any
    items: list[Any]
    future: asyncio.Future = field(repr=False)


class MicroBatcher:
    """`await submit(key, items)` -> results for `items`; `run(key, all_items)` does one batch per key."""

    def __init__(
        self,
        run: Callable[[Any, list[Any]], list[Any]],
        executor: ThreadPoolExecutor,
        max_items: int = 512,
        wait_s: float = 0.001,
        on_batch: Callable[[int], None] | None = None,
        max_wait_s: float | None = None,
    ) -> None:
        """`wait_s`: the quiet gap that ends a gathering; `max_wait_s` (default `wait_s`): its cap. `on_batch(n)`:
        told the size of every batch before it runs (a metrics histogram's `observe`)."""
        self._run = run
        self._on_batch = on_batch
        self._executor = executor
        self._max_items = max_items
        self._wait_s = wait_s
        self._max_wait_s = wait_s if max_wait_s is None else max(max_wait_s, wait_s)
        self._queue: asyncio.Queue[_Job] = asyncio.Queue()
        self._task: asyncio.Task | None = None

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._loop())

    async def stop(self) -> None:
        if self._task:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass

    async def submit(self, key: Any, items: list[Any]) -> list[Any]:
        future = asyncio.get_running_loop().create_future()
        await self._queue.put(_Job(key, items, future))
        return await future

    async def _gather(self) -> list[_Job]:
        """The next batch: the first job, then whatever arrives until the queue is quiet for `wait_s`, the batch
        holds `max_items`, or `max_wait_s` has passed since the first."""
        loop = asyncio.get_running_loop()
        jobs = [await self._queue.get()]
        count = len(jobs[0].items)
        deadline = loop.time() + self._max_wait_s
        while count < self._max_items:
            if self._queue.empty():
                left = deadline - loop.time()
                if left <= 0 or not self._wait_s:
                    break
                try:
                    job = await asyncio.wait_for(self._queue.get(), timeout=min(self._wait_s, left))
                except TimeoutError:
                    break
            else:
                job = self._queue.get_nowait()
            jobs.append(job)
            count += len(job.items)
        return jobs

    async def _loop(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            jobs = await self._gather()
            by_key: dict[int, list[_Job]] = {}
            for job in jobs:
                by_key.setdefault(id(job.key), []).append(job)
            for group in by_key.values():
                flat = [item for job in group for item in job.items]
                if self._on_batch is not None:
                    self._on_batch(len(flat))
                try:
                    results = await loop.run_in_executor(self._executor, self._run, group[0].key, flat)
                except Exception as exc:  # delivered to each waiting caller, which re-raises it
                    for job in group:
                        if not job.future.done():
                            job.future.set_exception(exc)
                    continue
                start = 0
                for job in group:
                    if not job.future.done():
                        job.future.set_result(results[start : start + len(job.items)])
                    start += len(job.items)
