from __future__ import annotations

import sys
from pathlib import Path
from typing import Literal

from pydantic import Field, model_validator
from pydantic_settings import SettingsConfigDict

from services.common.hardware import gpu_available
from services.common.settings import CommonSettings
from services.policy.stream_bound import StreamBound


class PolicySettings(CommonSettings):
    """`BRIDGE_POLICY_*` (plus the common `BRIDGE_*` and `REDIS_URL`)."""

    model_config = SettingsConfigDict(env_prefix="BRIDGE_POLICY_", extra="ignore", populate_by_name=True)

    host: str = Field("127.0.0.1", description="Bind address (0.0.0.0: every interface).")
    port: int = Field(8000, description="Port of the policy service.")
    engine: Literal["vllm", "transformers"] = Field(
        "vllm", description="vllm: an OpenAI-compatible vLLM server; transformers: in-process, where vLLM can't run."
    )
    model_dir: str | None = Field(None, description="HF causal-LM folder; default <models>/SmolLM2-135M-Instruct.")
    vllm_url: str | None = Field(
        None,
        description="Reach running vLLM servers here instead of starting any (comma-separated: one engine each, "
        "requests to the least busy, every swap reaching all).",
    )
    vllm_port: int = Field(8011, description="Port of the vLLM server the service starts (on 127.0.0.1).")
    vllm_api_key: str | None = Field(
        None,
        description="The API key of the vLLM servers (an external one's --api-key). Unset, a server this service "
        "starts gets a fresh random key, which only this service holds: no other local process can then load an "
        "adapter through vLLM's runtime LoRA route.",
    )
    vllm_engines: int = Field(
        1,
        ge=1,
        le=16,
        description="vLLM servers the service starts (ports vllm_port, vllm_port+1, ...; on CPU each bound to its "
        "share of the cores): requests go to the least busy, every adapter or weight swap reaches all first.",
    )
    vllm_python: str = Field(sys.executable, description="Interpreter that has vLLM installed.")
    vllm_args: str = Field("", description="Extra command-line arguments for the vLLM server.")
    vllm_enforce_eager: bool = Field(
        False,
        description="vLLM --enforce-eager: run the model without torch.compile (and CUDA graphs): a faster start, "
        "fewer tokens/s (docs/deployment.md, `python -m bench.engine_start`). For short-lived services.",
    )
    vllm_memory_utilization: float | None = Field(
        None, gt=0, le=1, description="vLLM --gpu-memory-utilization (on CPU: a RAM share, not the fixed KV size)."
    )
    vllm_cpu_kv_cache_tokens: int = Field(
        65_536,
        ge=1024,
        le=16_777_216,
        description="On CPU: the KV cache, in tokens of the served model (sized from its config.json at the served "
        "dtype, so fp32 gets the room bf16 gets): 32 agent contexts of 2k tokens.",
    )
    vllm_cpu_kv_cache_gib: float | None = Field(
        None, gt=0, le=512, description="On CPU: a fixed KV cache size in GiB instead of vllm_cpu_kv_cache_tokens."
    )
    vllm_startup_timeout_s: float = Field(
        900, ge=10, description="How long vLLM may take to answer /health (a compiled first start takes minutes)."
    )
    max_model_len: int = Field(4096, ge=256, description="vLLM --max-model-len: prompt plus generation, in tokens.")
    adapter_serving: Literal["auto", "lora", "merged"] = Field(
        "auto",
        description="How trained LoRA checkpoints serve: 'lora' adapters beside the base (vLLM's LoRA kernels), or "
        "'merged' into the weights and reloaded in place when the served version changes (base speed on vLLM-CPU, "
        "where its LoRA path is ~7x slower). 'auto': merged where the service starts vLLM on a CPU; else LoRA.",
    )
    max_lora_rank: int = Field(16, ge=1, le=256, description="vLLM --max-lora-rank (LoRA serving).")
    max_loras: int = Field(4, ge=1, le=64, description="vLLM --max-loras: adapters loaded at once (LoRA serving).")
    dtype: Literal["auto", "bfloat16", "float32"] = Field(
        "auto",
        description="Policy precision. auto: bf16 on a GPU or a CPU with native bf16 (AVX512-BF16/AMX), else fp32 "
        "(emulated bf16 is ~85x slower on an AVX2-only CPU; services/common/hardware.py).",
    )
    retriever_url: str = Field("http://127.0.0.1:8001", description="Where the agent searches.")
    max_new_tokens: int = Field(256, ge=8, le=4096, description="Tokens per generation turn.")
    initial_search: bool = Field(
        False,
        description="Retrieve with the question before the first generation: a scaffold for policies that never "
        "emit <search> on their own (the raw SmolLM2-135M). Off by default: the default policy, the reading warm "
        "start, writes its own <search> (docs/warmstart.md).",
    )
    serve_temperature: float = Field(
        0.0,
        ge=0,
        le=5,
        description="Decoding temperature of served queries (/v1/agent/query); 0 is greedy. Live learning from "
        "served traffic needs exploration: > 0 samples, and the trainer scores each trajectory at its own.",
    )
    serve_retrieval: Literal["greedy", "sample"] = Field(
        "greedy", description="Served queries' retrieval: greedy top-k, or a Plackett-Luce sample (exploration)."
    )
    serve_retrieval_share: float = Field(
        0.25,
        ge=0,
        le=1,
        description="With serve_retrieval=sample: the share of served queries that explore (a Plackett-Luce sample, "
        "its log-prob logged for the trainer); the rest retrieve greedy top-k, so most users see the best ranking.",
    )
    serve_retrieval_candidates: int = Field(20, ge=1, le=200, description="M candidates when serve_retrieval=sample.")
    serve_retrieval_temperature: float = Field(
        0.05, gt=0, le=100, description="Retrieval temperature when serve_retrieval=sample."
    )
    request_timeout_s: float = Field(600, ge=1, description="Cap on one engine call; a hung engine fails cleanly.")
    agent_deadline_s: float = Field(
        300,
        ge=1,
        le=3600,
        description="Cap on one /v1/agent/query, every turn and search together (504 past it): one request may not "
        "hold the engine for long. Rollouts, which train, are not bounded by it.",
    )
    trajectory_stream: str = Field("bridge:trajectories", description="Redis stream of every trajectory.")
    feedback_stream: str = Field("bridge:feedback", description="Redis stream of rewarded served trajectories.")
    stream_maxlen: int = Field(
        100_000,
        ge=100,
        description="Entries each stream is trimmed towards, sparing those a training run still needs (pending for "
        "it, or not yet read by it).",
    )
    stream_hard_maxlen: int = Field(
        250_000,
        ge=100,
        description="Past this many entries a stream is trimmed by count even of entries a run needs: a warning and "
        "bridge_policy_stream_needed_trimmed_total say so, and the run reports them lost.",
    )
    stream_group_idle_s: float = Field(
        6 * 3600,
        gt=0,
        description="A trainer's consumer group idle this long (its run failed and was left) no longer holds "
        "entries back from trimming.",
    )
    trajectory_ttl_s: int = Field(
        7 * 24 * 3600, ge=60, description="How long a trajectory stays readable at /v1/trajectories/{id}."
    )
    max_body_bytes: int = Field(2 * 1024 * 1024, ge=1024, description="Larger request bodies get a 413.")
    max_rollouts_in_flight: int = Field(
        8,
        ge=1,
        le=1_000,
        description="POST /v1/agent/rollouts requests in this service at once (each up to max_rollout_trajectories); "
        "one more is a 429 with Retry-After.",
    )
    max_rollout_trajectories: int = Field(
        256,
        ge=1,
        le=256,
        description="Cap on items x group_size in one POST /v1/agent/rollouts (the wire schema allows 256): "
        "bounds the work one request can ask of this deployment.",
    )
    api_keys: str = Field(
        "",
        description="Comma-separated keys; when any key is configured (here or in api_keys_file), the agent "
        "endpoints need 'X-API-Key: <key>' (or the admin bearer token). Empty: open.",
    )
    api_keys_file: Path | None = Field(None, description="A file of API keys, one per line ('#' starts a comment).")

    @property
    def resolved_api_keys(self) -> tuple[str, ...]:
        keys = [k.strip() for k in self.api_keys.split(",")]
        if self.api_keys_file is not None:
            lines = self.api_keys_file.read_text().splitlines()
            keys += [line.split("#", 1)[0].strip() for line in lines]
        return tuple(dict.fromkeys(k for k in keys if k))

    def explores(self, draw: float) -> bool:
        """Whether a served query with uniform `draw` in [0, 1) falls in the exploring share (never at share 0)."""
        return self.serve_retrieval == "sample" and draw < self.serve_retrieval_share

    def serve_retrieval_spec(self, top_k: int, explore: bool = True):
        """How a served query retrieves (recorded in its trajectory, so the trainer never assumes it); `explore`:
        this query drew the exploring share (`serve_retrieval_share`)."""
        from services.policy.agent import RetrievalSpec

        if self.serve_retrieval == "greedy" or not explore:
            return RetrievalSpec(top_k=top_k, candidates=top_k)
        return RetrievalSpec(top_k=top_k, mode="sample", candidates=max(top_k, self.serve_retrieval_candidates),
                             temperature=self.serve_retrieval_temperature)  # fmt: skip

    @property
    def resolved_model_dir(self) -> str:
        return self.model_dir or str(self.policy_model_dir)

    @model_validator(mode="after")
    def _merged_needs_vllm(self) -> PolicySettings:
        if self.adapter_serving == "merged" and self.engine != "vllm":
            raise ValueError("adapter_serving 'merged' reloads weights in vLLM; the transformers engine serves LoRA")
        return self

    @model_validator(mode="after")
    def _hard_cap_above_target(self) -> PolicySettings:
        if self.stream_hard_maxlen < self.stream_maxlen:
            raise ValueError(
                f"stream_hard_maxlen ({self.stream_hard_maxlen}) is below stream_maxlen "
                f"({self.stream_maxlen}): the hard cap must leave room for what runs still need"
            )
        return self

    @property
    def stream_bound(self) -> StreamBound:
        return StreamBound(self.stream_maxlen, self.stream_hard_maxlen, self.stream_group_idle_s)

    @property
    def serves_merged(self) -> bool:
        if self.adapter_serving == "auto":
            # An external server (vllm_url) was started by someone else, maybe without the dev-mode reload endpoints.
            return self.engine == "vllm" and self.vllm_url is None and not gpu_available()
        return self.adapter_serving == "merged"

    @property
    def vllm_urls(self) -> list[str]:
        """The external vLLM servers (none: the service starts `vllm_engines` of its own)."""
        return [u.strip() for u in (self.vllm_url or "").split(",") if u.strip()]

    @property
    def engine_count(self) -> int:
        return len(self.vllm_urls) or self.vllm_engines

    @property
    def state_dir(self):
        return self.data_dir / "policy"
