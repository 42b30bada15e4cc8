"""Serve given checkpoint versions for the length of an evaluation, then put back what was active."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from typing import Protocol

from services.common.schemas.checkpoints import ActivationResponse, CheckpointList


class Versioned(Protocol):
    def checkpoints(self) -> CheckpointList: ...
    def activate(self, version: str) -> ActivationResponse: ...


def activate_and_wait(client: Versioned, version: str, timeout_s: float = 3600) -> None:
    """A retriever checkpoint with a new document tower serves only after its corpus re-embed: wait for it."""
    if client.activate(version).status == "active":
        return
    deadline = time.monotonic() + timeout_s
    while client.checkpoints().active != version:
        if time.monotonic() > deadline:
            raise TimeoutError(f"{version} did not become active within {timeout_s:.0f}s")
        time.sleep(2)


@contextmanager
def _pin(client: Versioned, version: str) -> Iterator[None]:
    before = client.checkpoints().active
    if before != version:
        activate_and_wait(client, version)
    try:
        yield
    finally:
        if before != version:
            activate_and_wait(client, before)


@contextmanager
def pinned(targets: list[tuple[Versioned, str | None]]) -> Iterator[None]:
    """Activate each (client, version) whose version is given, in order (retriever first, as training
    publishes), and restore the versions that were active when the block ends, in reverse order."""
    with ExitStack() as stack:
        for client, version in targets:
            if version is not None:
                stack.enter_context(_pin(client, version))
        yield
