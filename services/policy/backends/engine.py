"""The LLM engine behind one interface: a vLLM OpenAI-compatible server, or transformers in-process.

Both take prompt token ids and return the generated token ids with their log-probs under the sampling
model (vLLM's raw log-probs: before temperature), so a trajectory's tokens are exactly what was sampled.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from transformers import PreTrainedTokenizerBase

BASE_ADAPTER = "base"


@dataclass(frozen=True)
class Generation:
    token_ids: list[int]
    logprobs: list[float]
    text: str
    finish_reason: str | None


@dataclass(frozen=True)
class SamplingSpec:
    max_tokens: int
    temperature: float  # 0 = greedy
    stop: tuple[str, ...]
    seed: int | None = None


class EngineError(Exception):
    """The engine failed or timed out; the caller answers 502/504, never a hang."""


class Engine(ABC):
    tokenizer: PreTrainedTokenizerBase
    # Whether start() compiles into a cache that other copies of the engine then load (EnginePool starts it alone).
    compiles: bool = False

    @abstractmethod
    async def start(self) -> None: ...

    @abstractmethod
    async def stop(self) -> None: ...

    @abstractmethod
    async def generate(self, prompt_ids: list[int], spec: SamplingSpec, adapter: str) -> Generation:
        """Continue `prompt_ids` with the base model (`adapter == "base"`) or a loaded LoRA adapter."""

    async def generate_streaming(
        self, prompt_ids: list[int], spec: SamplingSpec, adapter: str, on_text: Callable[[str], None]
    ) -> Generation:
        """`generate`, calling `on_text` with each piece of text as it is produced. Cancelling the awaiting task
        stops the generation. The result is the same Generation `generate` returns. This default sends the
        whole text at the end; engines that can stream override it."""
        generation = await self.generate(prompt_ids, spec, adapter)
        if generation.text:
            on_text(generation.text)
        return generation

    async def healthy(self) -> bool:
        """Whether the engine answers now (the console's health view); in-process engines are up once started."""
        return True

    @abstractmethod
    async def load_adapter(self, name: str, path: Path) -> None: ...

    @abstractmethod
    async def unload_adapter(self, name: str) -> None: ...

    async def swap_weights(self, folder: Path) -> None:
        """Replace the served model's weights with the safetensors in `folder` (same architecture), in place.
        Called only when no request is generating (services/policy/merged.py)."""
        raise EngineError(f"{type(self).__name__} cannot reload weights in place; serve adapters as LoRA")
