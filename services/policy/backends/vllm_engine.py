"""vLLM behind its OpenAI-compatible server: started as a subprocess (embedded) or reached by URL."""

from __future__ import annotations

import asyncio
import json
import os
import secrets
import shlex
import subprocess
import time
from collections.abc import Callable, Mapping
from pathlib import Path

import httpx
from transformers import AutoTokenizer

from services.common.errors import InvalidRequest
from services.common.hardware import resolve_dtype
from services.policy.backends.engine import BASE_ADAPTER, Engine, EngineError, Generation, SamplingSpec
from services.policy.settings import PolicySettings


def kv_bytes_per_token(model_dir: str | Path, dtype: str) -> int:
    """K and V of every layer's KV heads for one token, from the model's config.json."""
    config = json.loads((Path(model_dir) / "config.json").read_text())
    text = config.get("text_config", config)  # multimodal configs nest the language model's
    kv_heads = text.get("num_key_value_heads") or text["num_attention_heads"]
    head_dim = text.get("head_dim") or text["hidden_size"] // text["num_attention_heads"]
    return 2 * text["num_hidden_layers"] * kv_heads * head_dim * (4 if dtype == "float32" else 2)


def cpu_kv_cache_bytes(settings: PolicySettings, dtype: str) -> int:
    """The CPU KV cache: a fixed GiB where set, else room for `vllm_cpu_kv_cache_tokens` tokens at `dtype` (a fixed
    GiB holds half the tokens in fp32, which made 32 agent contexts thrash on an AVX2-only CPU: docs/performance.md)."""
    if settings.vllm_cpu_kv_cache_gib is not None:
        return int(settings.vllm_cpu_kv_cache_gib * 2**30)
    return settings.vllm_cpu_kv_cache_tokens * kv_bytes_per_token(settings.resolved_model_dir, dtype)


def cpu_share(index: int, engines: int, cpus: int) -> str:
    """The cores engine `index` of `engines` binds its OpenMP threads to ('a-b'): an equal share each, shared
    round the cores when there are more engines than cores."""
    per = max(1, cpus // engines)
    first = (index * per) % cpus
    return f"{first}-{min(first + per, cpus) - 1}"


class VLLMEngine(Engine):
    """`index`: which of the service's engines this is (its port vllm_port + index, its URL, log and cores)."""

    def __init__(self, settings: PolicySettings, index: int = 0) -> None:
        self.settings = settings
        self.index = index
        self.tokenizer = AutoTokenizer.from_pretrained(settings.resolved_model_dir)
        self.port = settings.vllm_port + index
        urls = settings.vllm_urls
        self.url = urls[index] if urls else f"http://127.0.0.1:{self.port}"
        self._process: subprocess.Popen | None = None
        # vLLM's /v1 routes (runtime LoRA loading among them) answer only this key: no other local process may load
        # an adapter from a path of its choosing. Passed in the environment, which, unlike argv, `ps` does not show.
        self.api_key = settings.vllm_api_key or (None if urls else secrets.token_urlsafe(32))
        headers = {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}
        self._http = httpx.AsyncClient(base_url=self.url, timeout=settings.request_timeout_s, headers=headers)

    def command(self) -> list[str]:
        s = self.settings
        extra = shlex.split(s.vllm_args)
        return [
            s.vllm_python, "-m", "vllm.entrypoints.openai.api_server",
            "--model", s.resolved_model_dir,
            "--served-model-name", BASE_ADAPTER,
            "--host", "127.0.0.1", "--port", str(self.port),
            "--dtype", self._dtype(),
            "--max-model-len", str(s.max_model_len),
            *self._lora_args(),
            "--disable-uvicorn-access-log",
            # Log-probs of softmax(logits / T), the distribution each token was drawn from: the trainer's
            # importance weights compare its own log-probs at the trajectory's temperature with these.
            "--logprobs-mode", "processed_logprobs",
            *(["--enforce-eager"] if s.vllm_enforce_eager and "--enforce-eager" not in extra else []),
            *self._cpu_args(),
            *extra,
        ]  # fmt: skip

    @property
    def eager(self) -> bool:
        """Whether vLLM runs the model uncompiled (the setting, or the flag in the user's own vllm_args)."""
        return self.settings.vllm_enforce_eager or "--enforce-eager" in shlex.split(self.settings.vllm_args)

    @property
    def compiles(self) -> bool:
        return not self.eager and not self.settings.vllm_urls

    def _lora_args(self) -> list[str]:
        if self.settings.serves_merged:  # adapters arrive merged into the weights: no LoRA layers to pay for
            return []
        s = self.settings
        return ["--enable-lora", "--max-lora-rank", str(s.max_lora_rank), "--max-loras", str(s.max_loras)]

    def _dtype(self) -> str:
        import torch

        if torch.cuda.is_available() and self.settings.dtype == "auto":
            return "auto"  # vLLM takes the checkpoint's (bf16 for SmolLM2 and Qwen2.5)
        return resolve_dtype(self.settings.dtype)

    def _cpu_args(self) -> list[str]:
        import torch

        if torch.cuda.is_available():
            share = self.settings.vllm_memory_utilization
            return [] if share is None else ["--gpu-memory-utilization", str(share)]
        # On CPU a share is of one NUMA node's RAM minus the engine's own RSS: the default (0.92) reserves most
        # of the RAM beside other services, and a small one goes negative where the node is small (a VM reporting
        # 11 of its 24 GB on node 0). A fixed size means the same everywhere.
        share = self.settings.vllm_memory_utilization
        memory = (["--gpu-memory-utilization", str(share)] if share is not None
                  else ["--kv-cache-memory-bytes", str(cpu_kv_cache_bytes(self.settings, self._dtype()))])  # fmt: skip
        # vllm-cpu 0.32 kills the engine when a seeded request's prefill is chunked ("CPU Generator does not
        # use offset"); rollouts are seeded, so prefill whole prompts.
        batched = max(8192, self.settings.max_model_len)
        return [*memory, "--no-enable-chunked-prefill", "--max-num-batched-tokens", str(batched)]

    def environment(self, base: Mapping[str, str]) -> dict[str, str]:
        """The vLLM server's environment: `base` (the service's own) without BRIDGE's settings and secrets, with what
        this engine needs; a variable the user set in `base` is kept."""
        env = {
            # Nothing of BRIDGE's own: vLLM needs none of it, and the admin token, the API keys and Redis's password
            # must not reach a process any adapter code runs in.
            **{k: v for k, v in base.items() if not k.startswith("BRIDGE_") and k != "REDIS_URL"},
            "VLLM_ALLOW_RUNTIME_LORA_UPDATING": "True",
            **({"VLLM_API_KEY": self.api_key} if self.api_key else {}),
            "VLLM_CACHE_ROOT": base.get("VLLM_CACHE_ROOT", str(self.settings.data_dir / "vllm-cache")),
        }
        if self.settings.serves_merged:
            # /pause, /resume and /collective_rpc (reload_weights) exist only in dev mode; the server listens
            # on 127.0.0.1, reached by this service alone.
            env["VLLM_SERVER_DEV_MODE"] = "1"
        if "VLLM_CPU_OMP_THREADS_BIND" not in env and os.cpu_count():
            env["VLLM_CPU_OMP_THREADS_BIND"] = cpu_share(self.index, self.settings.engine_count, os.cpu_count())
        # vllm-cpu 0.32 on torch 2.13 cannot load the AOT-compiled model it saved ("'function' object has no
        # attribute 'finalize_loading'"), so every start compiled the model again; its classic compile cache
        # loads. Measured on 2 cores, second start on a warm cache: engine init 52 s -> 15 s.
        env.setdefault("VLLM_USE_AOT_COMPILE", "0")
        return env

    async def start(self) -> None:
        if not self.settings.vllm_urls:
            logs = self.settings.data_dir / "logs"
            logs.mkdir(parents=True, exist_ok=True)
            env = self.environment(os.environ)
            self._log = (logs / ("vllm.log" if self.index == 0 else f"vllm-{self.index}.log")).open("ab")
            # A new session: Ctrl-C in the parent's terminal must not kill vLLM before we stop it in order.
            self._process = subprocess.Popen(
                self.command(), env=env, stdout=self._log, stderr=subprocess.STDOUT, start_new_session=True
            )
        await self._wait_healthy()

    async def _wait_healthy(self) -> None:
        deadline = time.monotonic() + self.settings.vllm_startup_timeout_s
        while time.monotonic() < deadline:
            if self._process is not None and self._process.poll() is not None:
                raise EngineError(f"vLLM exited with {self._process.returncode}; see {self.settings.data_dir}/logs")
            try:
                if (await self._http.get("/health", timeout=5)).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            await asyncio.sleep(1)
        raise EngineError(f"vLLM at {self.url} not healthy after {self.settings.vllm_startup_timeout_s}s")

    async def stop(self) -> None:
        await self._http.aclose()
        if self._process is not None and self._process.poll() is None:
            self._process.terminate()
            try:
                await asyncio.to_thread(self._process.wait, 30)
            except subprocess.TimeoutExpired:
                self._process.kill()
                await asyncio.to_thread(self._process.wait)
        self._process = None

    @staticmethod
    def _body(prompt_ids: list[int], spec: SamplingSpec, adapter: str) -> dict:
        return {
            "model": adapter,
            "prompt": prompt_ids,
            "max_tokens": spec.max_tokens,
            "temperature": spec.temperature,
            "top_p": 1.0,
            "seed": spec.seed,
            "stop": list(spec.stop),
            "include_stop_str_in_output": True,
            "logprobs": 0,
            "return_token_ids": True,
            "skip_special_tokens": False,
        }

    async def generate(self, prompt_ids: list[int], spec: SamplingSpec, adapter: str) -> Generation:
        body = self._body(prompt_ids, spec, adapter)
        try:
            response = await self._http.post("/v1/completions", json=body)
        except httpx.TimeoutException as exc:
            raise EngineError(f"vLLM did not answer within {self.settings.request_timeout_s}s") from exc
        except httpx.TransportError as exc:
            raise EngineError(f"vLLM unreachable: {exc}") from exc
        if response.status_code != 200:
            raise EngineError(f"vLLM answered {response.status_code}: {response.text[:300]}")
        choice = response.json()["choices"][0]
        return Generation(
            token_ids=list(choice["token_ids"]),
            logprobs=[float(x) for x in choice["logprobs"]["token_logprobs"]],
            text=choice["text"],
            finish_reason=choice.get("finish_reason"),
        )

    async def generate_streaming(
        self, prompt_ids: list[int], spec: SamplingSpec, adapter: str, on_text: Callable[[str], None]
    ) -> Generation:
        """vLLM's streamed completion: each chunk carries its text, token ids and their log-probs, so the joined
        chunks are the same Generation as `generate`. Cancelling closes the connection, and vLLM aborts the
        request when its client goes away."""
        body = {**self._body(prompt_ids, spec, adapter), "stream": True}
        token_ids: list[int] = []
        logprobs: list[float] = []
        text: list[str] = []
        finish_reason = None
        try:
            async with self._http.stream("POST", "/v1/completions", json=body) as response:
                if response.status_code != 200:
                    await response.aread()
                    raise EngineError(f"vLLM answered {response.status_code}: {response.text[:300]}")
                async for line in response.aiter_lines():
                    if not line.startswith("data: ") or line == "data: [DONE]":
                        continue
                    chunk = json.loads(line.removeprefix("data: "))
                    if "error" in chunk:
                        raise EngineError(f"vLLM stream failed: {str(chunk['error'])[:300]}")
                    for choice in chunk.get("choices", []):
                        token_ids += choice.get("token_ids") or []
                        logprobs += [float(x) for x in (choice.get("logprobs") or {}).get("token_logprobs") or []]
                        finish_reason = choice.get("finish_reason") or finish_reason
                        if choice.get("text"):
                            text.append(choice["text"])
                            on_text(choice["text"])
        except httpx.TimeoutException as exc:
            raise EngineError(f"vLLM did not answer within {self.settings.request_timeout_s}s") from exc
        except httpx.TransportError as exc:
            raise EngineError(f"vLLM unreachable: {exc}") from exc
        if len(token_ids) != len(logprobs):
            raise EngineError(f"vLLM streamed {len(token_ids)} tokens but {len(logprobs)} log-probs")
        return Generation(token_ids=token_ids, logprobs=logprobs, text="".join(text), finish_reason=finish_reason)

    async def healthy(self) -> bool:
        try:
            return (await self._http.get("/health", timeout=5)).status_code == 200
        except httpx.TransportError:
            return False

    async def swap_weights(self, folder: Path) -> None:
        # Pause first: requests still in vLLM (none of ours: see ServedWeights) finish on the old weights, and
        # the prefix cache, computed with them, is dropped.
        await self._admin("/pause", params={"mode": "wait", "clear_cache": "true"})
        try:
            rpc = {"method": "reload_weights", "kwargs": {"weights_path": str(folder)}}
            await self._admin("/collective_rpc", json=rpc)
        finally:
            await self._admin("/resume")

    async def _admin(self, path: str, **kwargs) -> None:
        try:
            response = await self._http.post(path, **kwargs)
        except httpx.HTTPError as exc:
            raise EngineError(f"vLLM {path} failed: {exc}") from exc
        if response.status_code != 200:
            raise EngineError(f"vLLM {path} answered {response.status_code}: {response.text[:300]}")

    async def load_adapter(self, name: str, path: Path) -> None:
        body = {"lora_name": name, "lora_path": str(path), "load_inplace": True}
        response = await self._http.post("/v1/load_lora_adapter", json=body)
        if 400 <= response.status_code < 500:  # the adapter itself (its rank, its modules): the caller's to fix
            raise InvalidRequest(f"vLLM refused adapter {name}: {response.text[:300]}", param="path",
                                 code="adapter_refused")  # fmt: skip
        if response.status_code != 200:
            raise EngineError(f"vLLM refused adapter {name}: {response.text[:300]}")

    async def unload_adapter(self, name: str) -> None:
        response = await self._http.post("/v1/unload_lora_adapter", json={"lora_name": name})
        if response.status_code not in (200, 404):
            raise EngineError(f"vLLM could not unload adapter {name}: {response.text[:300]}")
