"""transformers in-process: for machines where vLLM can't run. One generation at a time (no batching)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

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
                self.settings.resolved_model_dir, dtype=getattr(torch, self.settings.dtype)
            )
            return model.eval()

        self.model = await asyncio.to_thread(load)

    async def stop(self) -> None:
        self.model = None

    def _generate_sync(self, prompt_ids: list[int], spec: SamplingSpec, adapter: str) -> Generation:
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
        # Raw log-probs (before temperature), as vLLM reports them.
        logprobs = [
            float(torch.log_softmax(logits[0].float(), dim=-1)[tok])
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
