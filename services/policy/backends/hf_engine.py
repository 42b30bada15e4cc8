"""transformers in-process: for machines where vLLM can't run. One generation at a time (no batching)."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, StoppingCriteria, StoppingCriteriaList
from transformers.generation.streamers import BaseStreamer

from services.common.hardware import resolve_dtype
from services.policy.backends.engine import BASE_ADAPTER, Engine, EngineError, Generation, SamplingSpec
from services.policy.settings import PolicySettings


class TransformersEngine(Engine):
    def __init__(self, settings: PolicySettings) -> None:
        self.settings = settings
        self.tokenizer = AutoTokenizer.from_pretrained(settings.resolved_model_dir)
        self.model = None
        self._lock = asyncio.Lock()
        self._adapters: set[str] = set()

    async def start(self) -> None:
        def load():
            model = AutoModelForCausalLM.from_pretrained(
                self.settings.resolved_model_dir, dtype=getattr(torch, resolve_dtype(self.settings.dtype))
            )
            return model.eval()

        self.model = await asyncio.to_thread(load)

    async def stop(self) -> None:
        self.model = None

    def _generate_sync(
        self,
        prompt_ids: list[int],
        spec: SamplingSpec,
        adapter: str,
        streamer: BaseStreamer | None = None,
        stop: threading.Event | None = None,
    ) -> Generation:
        model = self.model
        if adapter != BASE_ADAPTER:
            model.set_adapter(adapter)
        if spec.seed is not None:
            torch.manual_seed(spec.seed)
        input_ids = torch.tensor([prompt_ids])
        kwargs = dict(
            max_new_tokens=spec.max_tokens,
            do_sample=spec.temperature > 0,
            stop_strings=list(spec.stop) or None,
            tokenizer=self.tokenizer,
            return_dict_in_generate=True,
            output_logits=True,
            pad_token_id=self.tokenizer.pad_token_id or self.tokenizer.eos_token_id,
            streamer=streamer,
            stopping_criteria=StoppingCriteriaList([_StopWhenSet(stop)]) if stop is not None else None,
        )
        if spec.temperature > 0:
            kwargs.update(temperature=spec.temperature, top_p=1.0, top_k=0)
        with torch.inference_mode():
            if adapter == BASE_ADAPTER and self._adapters:
                with model.disable_adapter():
                    out = model.generate(input_ids, attention_mask=torch.ones_like(input_ids), **kwargs)
            else:
                out = model.generate(input_ids, attention_mask=torch.ones_like(input_ids), **kwargs)
        generated = out.sequences[0, len(prompt_ids) :].tolist()
        # Log-probs of the distribution sampled from, softmax(logits / T) (vLLM's processed_logprobs; greedy:
        # the raw ones): the trainer scores each trajectory at its own temperature.
        scale = spec.temperature if spec.temperature > 0 else 1.0
        logprobs = [
            float(torch.log_softmax(logits[0].float() / scale, dim=-1)[tok])
            for logits, tok in zip(out.logits, generated, strict=True)
        ]
        eos = self.tokenizer.eos_token_id
        finish = "stop" if (generated and generated[-1] == eos) or len(generated) < spec.max_tokens else "length"
        return Generation(generated, logprobs, self.tokenizer.decode(generated), finish)

    async def generate(self, prompt_ids: list[int], spec: SamplingSpec, adapter: str) -> Generation:
        if adapter != BASE_ADAPTER and adapter not in self._adapters:
            raise EngineError(f"adapter {adapter} is not loaded")
        async with self._lock:
            try:
                return await asyncio.wait_for(
                    asyncio.to_thread(self._generate_sync, prompt_ids, spec, adapter),
                    self.settings.request_timeout_s,
                )
            except TimeoutError as exc:
                raise EngineError(f"generation took longer than {self.settings.request_timeout_s}s") from exc

    async def generate_streaming(
        self, prompt_ids: list[int], spec: SamplingSpec, adapter: str, on_text: Callable[[str], None]
    ) -> Generation:
        """Tokens reach `on_text` from the generating thread (through the event loop) as they are sampled;
        cancelling stops the thread at its next token and waits for it, so the model is never shared."""
        if adapter != BASE_ADAPTER and adapter not in self._adapters:
            raise EngineError(f"adapter {adapter} is not loaded")
        loop = asyncio.get_running_loop()
        streamer = _TextStreamer(self.tokenizer, lambda piece: loop.call_soon_threadsafe(on_text, piece))
        stop = threading.Event()
        async with self._lock:
            work = asyncio.ensure_future(
                asyncio.to_thread(self._generate_sync, prompt_ids, spec, adapter, streamer, stop)
            )
            try:
                return await asyncio.wait_for(asyncio.shield(work), self.settings.request_timeout_s)
            except TimeoutError as exc:
                stop.set()
                await asyncio.wait([work])
                raise EngineError(f"generation took longer than {self.settings.request_timeout_s}s") from exc
            except asyncio.CancelledError:
                stop.set()
                await asyncio.wait([work])
                raise

    async def load_adapter(self, name: str, path: Path) -> None:
        from peft import PeftModel

        async with self._lock:
            if not self._adapters:
                self.model = await asyncio.to_thread(PeftModel.from_pretrained, self.model, str(path), name)
            else:
                if name in self._adapters:
                    self.model.delete_adapter(name)
                await asyncio.to_thread(self.model.load_adapter, str(path), name)
            self.model.eval()
            self._adapters.add(name)

    async def unload_adapter(self, name: str) -> None:
        async with self._lock:
            if name in self._adapters and len(self._adapters) > 1:
                self.model.delete_adapter(name)
                self._adapters.discard(name)


class _StopWhenSet(StoppingCriteria):
    def __init__(self, event: threading.Event) -> None:
        self.event = event

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor, **kwargs) -> torch.Tensor:
        return torch.full((input_ids.shape[0],), self.event.is_set(), dtype=torch.bool)


class _TextStreamer(BaseStreamer):
    """Generated token ids in, text pieces out: decodes everything so far and sends what is new, holding back an
    incomplete UTF-8 character. `generate` first puts the prompt, which is skipped."""

    def __init__(self, tokenizer, send: Callable[[str], None]) -> None:
        self.tokenizer = tokenizer
        self.send = send
        self.ids: list[int] = []
        self.sent = 0
        self.prompt_seen = False

    def put(self, value: torch.Tensor) -> None:
        if not self.prompt_seen:
            self.prompt_seen = True
            return
        self.ids += value.reshape(-1).tolist()
        text = self.tokenizer.decode(self.ids)
        if text.endswith("\ufffd"):
            return
        if len(text) > self.sent:
            self.send(text[self.sent :])
            self.sent = len(text)

    def end(self) -> None:
        text = self.tokenizer.decode(self.ids)
        if len(text) > self.sent:
            self.send(text[self.sent :])
            self.sent = len(text)
