"""Agent throughput: the policy service against a one-by-one loop, and against vLLM's raw generation.

Starts a retriever (demo corpus) and the policy service (which starts vLLM), then answers 64 hotpotqa
questions (the demo set) three ways, side by side in one run:
  - the policy service at concurrency 1, 8 and 32 (questions/s, p50/p99 latency, generated tokens/s);
  - the baseline: the same protocol one question at a time in a plain loop against the same vLLM server;
  - vLLM's own raw generation tokens/s for the same number of concurrent streams (plain completions);
  - a trained checkpoint (the shipped warm-start LoRA, r 16 on every linear layer, published as a policy-lora
    checkpoint on the raw base) activated in the same service at concurrency 32, served merged into the weights
    (the service runs with BRIDGE_POLICY_ADAPTER_SERVING=merged); its speed is compared like for like as vLLM's raw
    tokens/s on the same prompts, exactly --max-tokens each, before and after the trained weights are reloaded (the
    agent rows differ in work: the trained policy searches and answers where the raw base rambles); and, unless
    --no-lora-row, the same checkpoint in a second service that serves it as a LoRA adapter
    (BRIDGE_POLICY_ADAPTER_SERVING=lora).
Targets, printed as ratios: >= 8x the baseline's questions/s at concurrency 32, >= 0.9x vLLM's raw tokens/s at
the same concurrency, and a trained checkpoint's tokens/s >= 0.9x the base model's.

    python -m bench.agent [--questions 64] [--max-turns 1] [--max-tokens 48] [--no-lora-row] [--repeat 3]

The services start once and every row is measured `--repeat` times (default 3; the LoRA row's repeats run after
the merged ones, on their own service); every ratio is printed per repeat, then as its median and spread with the
CPU, and written to `--json` (docs/results/bench/agent.json, which `python -m tools.perf_table --write` puts in
docs/performance.md).
"""

from __future__ import annotations

import asyncio
import json
import re
import shutil
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

import httpx

from bench.baselines.sequential_agent import answer as baseline_answer
from bench.repeat import Ratios, add_repeat_arguments, finish, repeat
from bench.script import DEMO_DATA, prepare_models, script_parser
from services.cli.ingest import ingest_file
from services.common.checkpoints import publish_checkpoint, staging_dir
from services.common.clients.retriever import RetrieverClient
from services.common.registry import BASE_VERSION
from services.common.stats import percentile
from services.modeling.shipped import DEFAULT_ADAPTER_DIR
from tests.conftest import RunningService, policy_env, start_service, stop_service


async def run_service(url: str, questions: list[str], concurrency: int, max_turns: int) -> dict:
    """`questions` through the service's agent endpoint by `concurrency` clients: questions/s, latency, the seconds
    it took and the trajectory ids (their tokens are counted after, outside the timed window: `generated_tokens`)."""
    latencies: list[float] = []
    ids: list[str] = []
    queue: asyncio.Queue = asyncio.Queue()
    for q in questions:
        queue.put_nowait(q)

    async def worker(client: httpx.AsyncClient) -> None:
        while not queue.empty():
            q = queue.get_nowait()
            started = time.perf_counter()
            response = await client.post("/v1/agent/query", json={"question": q, "max_turns": max_turns})
            response.raise_for_status()
            latencies.append(time.perf_counter() - started)
            ids.append(response.json()["trajectory_id"])

    async with httpx.AsyncClient(base_url=url, timeout=1800) as client:
        started = time.perf_counter()
        await asyncio.gather(*(worker(client) for _ in range(concurrency)))
        elapsed = time.perf_counter() - started
    return {
        "qps": len(questions) / elapsed,
        "p50": percentile(latencies, 0.5),
        "p99": percentile(latencies, 0.99),
        "elapsed": elapsed,
        "ids": ids,
    }


def generated_tokens(url: str, trajectory_ids: list[str]) -> int:
    """Tokens the policy generated in these trajectories (from the service's trajectory log)."""
    with httpx.Client(base_url=url, timeout=600) as client:
        records = [client.get(f"/v1/trajectories/{t}").json() for t in trajectory_ids]
    return sum(len(turn["generated_ids"]) for record in records for turn in record["turns"])


def service_row(policy_url: str, vllm_url: str, questions: list[str], concurrency: int,
                max_turns: int) -> tuple[dict, dict[str, float]]:  # fmt: skip
    """One agent row, and what the engine did during it (only while the questions run: the trajectories are read
    after, or the engine would look idle while we read them)."""
    r, engine = engine_during(vllm_url, lambda: asyncio.run(run_service(policy_url, questions, concurrency, max_turns)))
    r["tok_s"] = generated_tokens(policy_url, r.pop("ids")) / r["elapsed"]
    return r, engine


async def raw_vllm(
    url: str, prompts: list[str], concurrency: int, max_tokens: int, fixed_length: bool = False, key: str | None = None
) -> float:
    """vLLM's own completions tokens/s; `fixed_length` generates exactly `max_tokens` for every prompt (ignore_eos),
    so two weight sets are timed on identical work whatever they would say."""
    queue: asyncio.Queue = asyncio.Queue()
    for p in prompts:
        queue.put_nowait(p)
    produced = 0

    async def worker(client: httpx.AsyncClient) -> None:
        nonlocal produced
        while not queue.empty():
            body = {"model": "base", "prompt": queue.get_nowait(), "max_tokens": max_tokens, "temperature": 0.0,
                    "ignore_eos": fixed_length}  # fmt: skip
            response = await client.post("/v1/completions", json=body)
            produced += response.json()["usage"]["completion_tokens"]

    headers = {"Authorization": f"Bearer {key}"} if key else {}
    async with httpx.AsyncClient(base_url=url, timeout=1800, headers=headers) as client:
        started = time.perf_counter()
        await asyncio.gather(*(worker(client) for _ in range(concurrency)))
        return produced / (time.perf_counter() - started)


T = TypeVar("T")
# vLLM's own counters (its /metrics, Prometheus text), summed over labels: what the engine did during a row.
ENGINE_SAMPLES = {
    "prompt_tokens": "vllm:prompt_tokens_total",
    "cached_prompt_tokens": "vllm:prompt_tokens_cached_total",
    "generation_tokens": "vllm:generation_tokens_total",
    "requests": "vllm:request_prefill_time_seconds_count",
    "queue_s": "vllm:request_queue_time_seconds_sum",
    "prefill_s": "vllm:request_prefill_time_seconds_sum",
    "decode_s": "vllm:request_decode_time_seconds_sum",
    # Each request's seconds in the running batch: their sum over a row's wall time is the mean batch size.
    "running_s": "vllm:request_inference_time_seconds_sum",
    # One observation per engine step (the tokens it scheduled): steps taken and tokens a step.
    "steps": "vllm:iteration_tokens_total_count",
    "step_tokens": "vllm:iteration_tokens_total_sum",
}
# Gauges, sampled while a row runs: is the engine doing anything right now?
ENGINE_GAUGES = {"running": "vllm:num_requests_running", "waiting": "vllm:num_requests_waiting"}
GAUGE_LINE = re.compile(r"^(vllm:num_requests_(?:running|waiting))(?:\{[^}]*\})? ([0-9.eE+-]+)$", re.MULTILINE)


def engine_counters(vllm_url: str) -> dict[str, float]:
    return parse_engine_counters(httpx.get(vllm_url + "/metrics", timeout=30).text)


def parse_engine_counters(text: str) -> dict[str, float]:
    from prometheus_client.parser import text_string_to_metric_families

    totals = dict.fromkeys(ENGINE_SAMPLES, 0.0)
    wanted = {sample: key for key, sample in ENGINE_SAMPLES.items()}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name in wanted:
                totals[wanted[sample.name]] += sample.value
    return totals


def parse_engine_gauges(text: str) -> dict[str, float]:
    """The running and waiting request counts, summed over labels. A regex, not the Prometheus parser: it runs
    several times a second on the cores being measured."""
    totals = dict.fromkeys(ENGINE_GAUGES, 0.0)
    key = {name: k for k, name in ENGINE_GAUGES.items()}
    for name, value in GAUGE_LINE.findall(text):
        totals[key[name]] += float(value)
    return totals


def engine_gauges(vllm_url: str) -> dict[str, float]:
    return parse_engine_gauges(httpx.get(vllm_url + "/metrics", timeout=30).text)


def sample_gauges(vllm_url: str, every_s: float, stop: threading.Event, into: list[dict[str, float]]) -> None:
    while not stop.wait(every_s):
        into.append(engine_gauges(vllm_url))


def engine_during(vllm_url: str, run: Callable[[], T], sample_every_s: float = 0.25) -> tuple[T, dict[str, float]]:
    """`run()`'s result, and what the engine did meanwhile: tokens computed per second (prompt tokens not served from
    the prefix cache, plus generated ones), the prefix cache's share of prompt tokens, per request the seconds
    queued, prefilling and decoding; the mean running batch and tokens per engine step (from its counters); and,
    from its request gauges sampled every `sample_every_s`, the share of the row it had nothing to do (no request
    running or waiting: the time spent in our code, HTTP and the retriever between turns)."""
    samples: list[dict[str, float]] = []
    stop = threading.Event()
    sampler = threading.Thread(target=sample_gauges, args=(vllm_url, sample_every_s, stop, samples), daemon=True)
    before, started = engine_counters(vllm_url), time.perf_counter()
    sampler.start()
    try:
        result = run()
    finally:
        stop.set()
        sampler.join()
    seconds, after = time.perf_counter() - started, engine_counters(vllm_url)
    d = {key: after[key] - before[key] for key in ENGINE_SAMPLES}
    requests, steps = max(d["requests"], 1.0), max(d["steps"], 1.0)
    computed = d["prompt_tokens"] - d["cached_prompt_tokens"] + d["generation_tokens"]
    idle = sum(1 for g in samples if g["running"] + g["waiting"] == 0) / max(len(samples), 1)
    busy_s = seconds * (1.0 - idle)
    return result, {
        "computed_tok_s": computed / seconds,
        "prompt_tok_s": (d["prompt_tokens"] - d["cached_prompt_tokens"]) / seconds,
        "gen_tok_s": d["generation_tokens"] / seconds,
        "cached_share": d["cached_prompt_tokens"] / max(d["prompt_tokens"], 1.0),
        "prompt_per_request": d["prompt_tokens"] / requests,
        "gen_per_request": d["generation_tokens"] / requests,
        "queue_s": d["queue_s"] / requests,
        "prefill_s": d["prefill_s"] / requests,
        "decode_s": d["decode_s"] / requests,
        "mean_running": d["running_s"] / seconds,
        "tokens_per_step": d["step_tokens"] / steps,
        "idle_share": idle,
        "gauge_samples": float(len(samples)),
        # Like for like across rows that do different work: tokens computed per second the engine had work.
        "busy_computed_tok_s": computed / busy_s if busy_s > 0 else 0.0,
        "step_ms": 1000.0 * busy_s / steps,
    }


def engine_line(label: str, e: dict[str, float]) -> str:
    return (f"engine during {label}: {e['computed_tok_s']:.0f} computed tok/s (prompt {e['prompt_tok_s']:.0f} + "
            f"generated {e['gen_tok_s']:.0f}; {e['cached_share']:.0%} of prompt tokens from the prefix cache); per "
            f"request {e['prompt_per_request']:.0f} prompt / {e['gen_per_request']:.0f} generated tokens, queued "
            f"{e['queue_s']:.2f} s, prefill {e['prefill_s']:.2f} s, decode {e['decode_s']:.2f} s; mean running batch "
            f"{e['mean_running']:.1f}, {e['tokens_per_step']:.1f} tokens a step, {e['step_ms']:.0f} ms a step; idle "
            f"{e['idle_share']:.0%} of {e['gauge_samples']:.0f} samples; {e['busy_computed_tok_s']:.0f} computed "
            f"tok/s while busy")  # fmt: skip


def publish_trained(policy_data_dir: Path, version: str = "trained") -> str:
    """The shipped warm-start LoRA as a policy-lora checkpoint of the service in `policy_data_dir`."""
    root = policy_data_dir / "checkpoints"
    staging = staging_dir(root, version)
    for name in ("adapter_model.safetensors", "adapter_config.json"):
        shutil.copyfile(DEFAULT_ADAPTER_DIR / name, staging / name)
    publish_checkpoint(staging, root / version, kind="policy-lora", version=version, parent="base")
    return version


def admin(policy) -> dict[str, str]:
    return {"Authorization": f"Bearer {policy.token}"}


def active_version(policy) -> str:
    return httpx.get(policy.url + "/v1/checkpoints", timeout=30).json()["active"]


def activate(policy, version: str) -> None:
    """Register `version` (a no-op when it already is: the registry keys it by its folder) and serve it. The base
    has no folder to register: it is activated alone (a repetition after the first goes back to it)."""
    steps = [] if version == BASE_VERSION else [("/v1/checkpoints", {"path": version})]
    for path, body in [*steps, (f"/v1/checkpoints/{version}/activate", None)]:
        httpx.post(policy.url + path, json=body, headers=admin(policy), timeout=600).raise_for_status()


def row(label: str, r: dict, raw: float | None = None) -> str:
    extra = "" if raw is None else f" {raw:>15.1f}"
    return f"{label:26} {r['qps']:>7.2f} {r['p50']:>7.2f} {r['p99']:>7.2f} {r['tok_s']:>10.1f}{extra}"


def run_baseline(questions: list[str], tokenizer, vllm_url: str, retriever_url: str, args) -> dict:
    """The same protocol one question at a time in a plain loop against the same vLLM server."""
    started, produced = time.perf_counter(), 0
    latencies = []
    with httpx.Client(base_url=vllm_url, timeout=600) as vllm, httpx.Client(base_url=retriever_url) as ret:
        for q in questions:
            t0 = time.perf_counter()
            _, tokens = baseline_answer(q, tokenizer, vllm, ret, max_turns=args.max_turns, max_tokens=args.max_tokens)
            latencies.append(time.perf_counter() - t0)
            produced += tokens
    elapsed = time.perf_counter() - started
    return {
        "qps": len(questions) / elapsed,
        "p50": percentile(latencies, 0.5),
        "p99": percentile(latencies, 0.99),
        "tok_s": produced / elapsed,
    }


@dataclass(frozen=True)
class Setup:
    """What every repetition drives: the services, the questions and their bare prompts."""

    retriever_url: str
    vllm_url: str
    tokenizer: object
    questions: list[str]
    prompts: list[str]
    vllm_key: str = ""  # the engine's API key (policy_env sets one), for the raw-vLLM rows


@dataclass
class Stack:
    """A retriever on the demo corpus and a policy service (with its vLLM) on it; `restart_policy` swaps the policy
    service for one with other settings (one engine at a time on the cores)."""

    tmp: Path
    retriever: RunningService
    policy: RunningService
    env: dict[str, str]
    setup: Setup

    def restart_policy(self, label: str, **env: str) -> RunningService:
        stop_service(self.policy)
        self.env = {**self.env, **env}
        self.policy = start_service("policy", self.tmp / label, self.env, timeout=900)
        return self.policy


@contextmanager
def start_stack(work: Path, questions: int, max_tokens: int, prefix: str) -> Iterator[Stack]:
    """The benches' stack: the tiny models prepared under `work`, a retriever holding the demo corpus, the policy
    service serving trained checkpoints merged (each answer at most `max_tokens` a turn), the first `questions` demo
    questions and their bare prompts; both services stopped on the way out."""
    models = prepare_models(work)
    texts = [json.loads(line)["question"] for line in (DEMO_DATA / "hotpotqa_train.jsonl").open()][:questions]
    tmp = Path(tempfile.mkdtemp(prefix=prefix))
    retriever = start_service("retriever", tmp / "retriever", {"BRIDGE_RETRIEVER_ENCODER_DIR": str(models.retriever)})
    policy = None
    try:
        with RetrieverClient(retriever.url, admin_token=retriever.token, timeout=600) as client:
            ingest_file(client, DEMO_DATA / "hotpotqa_corpus.jsonl", progress=False)
        env = policy_env(models.root, retriever.url, BRIDGE_POLICY_MAX_NEW_TOKENS=str(max_tokens),
                         BRIDGE_POLICY_ADAPTER_SERVING="merged")  # fmt: skip
        policy = start_service("policy", tmp / "policy", env, timeout=900)
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(env["BRIDGE_POLICY_MODEL_DIR"])
        prompts = [tokenizer.decode(tokenizer(q)["input_ids"]) for q in texts]
        vllm_url = f"http://127.0.0.1:{env['BRIDGE_POLICY_VLLM_PORT']}"
        stack = Stack(
            tmp,
            retriever,
            policy,
            env,
            Setup(retriever.url, vllm_url, tokenizer, texts, prompts, env["BRIDGE_POLICY_VLLM_API_KEY"]),
        )
        try:
            yield stack
        finally:
            policy = stack.policy  # the one running now, after any restart
    finally:
        if policy is not None:
            stop_service(policy)
        stop_service(retriever)


def measure_merged(policy, setup: Setup, args, base: str, trained: str, index: int, service32: list[dict]) -> Ratios:
    """One repetition on the merged-serving service: the baseline, the service at 1/8/32 against raw vLLM, and the
    trained checkpoint (like for like on raw vLLM, then as an agent). Appends the service@32 row to `service32`."""
    if index:  # the previous repetition left the trained weights in; warm the reloaded base up as at the start
        activate(policy, base)
        asyncio.run(run_service(policy.url, setup.questions[:2], 2, args.max_turns))
    baseline = run_baseline(setup.questions, setup.tokenizer, setup.vllm_url, setup.retriever_url, args)
    print(f"\n{len(setup.questions)} questions, max_turns {args.max_turns}, {args.max_tokens} tokens/turn, greedy")
    print(f"{'':26} {'q/s':>7} {'p50 s':>7} {'p99 s':>7} {'gen tok/s':>10} {'raw vLLM tok/s':>15}")
    print(row("baseline (1 by 1)", baseline))
    results, engine = {}, {}
    for concurrency in (1, 8, 32):
        r, engine[concurrency] = service_row(policy.url, setup.vllm_url, setup.questions, concurrency, args.max_turns)
        raw = asyncio.run(raw_vllm(setup.vllm_url, setup.prompts, concurrency, args.max_tokens, key=setup.vllm_key))
        r["raw"] = raw
        results[concurrency] = r
        print(row(f"service, conc {concurrency}", r, raw))
    # Like for like: the same prompts, exactly max_tokens each, before and after the trained weights go in
    # (merged serving reloads them in place under the same served model name).
    fixed, engine["fixed"] = engine_during(
        setup.vllm_url,
        lambda: asyncio.run(
            raw_vllm(setup.vllm_url, setup.prompts, 32, args.max_tokens, fixed_length=True, key=setup.vllm_key)
        ),
    )
    print(engine_line("the service at 32", engine[32]))
    print(engine_line("raw vLLM at 32, fixed length", engine["fixed"]))
    same_work = [fixed]
    activate(policy, trained)
    same_work.append(
        asyncio.run(raw_vllm(setup.vllm_url, setup.prompts, 32, args.max_tokens, fixed_length=True, key=setup.vllm_key))
    )
    print(f"raw vLLM tok/s at 32, same prompts, {args.max_tokens} tokens each: "
          f"base {same_work[0]:.1f}, trained (merged) {same_work[1]:.1f}")  # fmt: skip
    merged, engine["trained"] = service_row(policy.url, setup.vllm_url, setup.questions, 32, args.max_turns)
    print(row("trained, merged, conc 32", merged))
    print(engine_line("the trained policy's agent at 32", engine["trained"]))
    r32 = results[32]
    service32.append(r32)
    ratios = {
        "qps/service@32_over_baseline": r32["qps"] / baseline["qps"],
        "tok_s/service@32_over_raw_vllm@32": r32["tok_s"] / r32["raw"],
        "tok_s/trained_merged_over_base@32_same_work": same_work[1] / same_work[0],
        "agent_tok_s/trained_merged_over_base@32": merged["tok_s"] / r32["tok_s"],
        # Section 2: is the engine as busy during the agent as on fixed-length work (tokens it computed per second)?
        "engine_computed_tok_s/service@32_over_fixed_length@32": engine[32]["computed_tok_s"]
        / engine["fixed"]["computed_tok_s"],
        # ... and like for like: per second it had work, and how full its batch was then.
        "engine_busy_computed_tok_s/service@32_over_fixed_length@32": engine[32]["busy_computed_tok_s"]
        / max(engine["fixed"]["busy_computed_tok_s"], 1e-9),
        "engine_mean_running/service@32_over_fixed_length@32": engine[32]["mean_running"]
        / max(engine["fixed"]["mean_running"], 1e-9),
        "engine_idle_share/service@32": engine[32]["idle_share"],
    }
    print(f"\nquestions/s ratio service@32 / baseline: {ratios['qps/service@32_over_baseline']:.2f}x (target >= 8x)")
    print(f"generated tok/s ratio service@32 / raw vLLM@32: {ratios['tok_s/service@32_over_raw_vllm@32']:.2f}x "
          f"(target >= 0.9x)")  # fmt: skip
    print(f"trained policy tok/s ratio trained (merged)/base at 32, identical work: "
          f"{ratios['tok_s/trained_merged_over_base@32_same_work']:.2f}x (target >= 0.9x)")  # fmt: skip
    # Not like for like: the trained policy searches and answers where the raw base rambles.
    print(f"agent tok/s ratio trained (merged)/base at 32: {ratios['agent_tok_s/trained_merged_over_base@32']:.2f}x")
    return ratios


def measure_lora(policy, setup: Setup, args, base32: dict) -> float:
    """The trained checkpoint served as a LoRA adapter at 32 (already active): its agent tok/s over the base's."""
    lora, _ = service_row(policy.url, setup.vllm_url, setup.questions, 32, args.max_turns)
    print(row("trained, LoRA, conc 32", lora))
    ratio = lora["tok_s"] / base32["tok_s"]
    print(f"agent tok/s ratio trained (lora)/base at 32: {ratio:.2f}x")
    return ratio


def main(argv: list[str] | None = None) -> None:
    parser = script_parser(__doc__)
    parser.add_argument("--questions", type=int, default=64)
    parser.add_argument("--max-turns", type=int, default=1)
    parser.add_argument("--max-tokens", type=int, default=48)
    parser.add_argument("--no-lora-row", action="store_true", help="Skip the trained checkpoint served as LoRA.")
    cost = ("The services start once, the rows repeat: one whole run with --questions 32 took ~7.5 min on a 2-core "
            "AMX machine (bf16) and ~13.5 min on AVX2 only (fp32), start-up included; the default 64 questions take "
            "about twice that a repetition.")  # fmt: skip
    add_repeat_arguments(parser, "agent", cost=cost)
    args = parser.parse_args(argv)
    started = time.perf_counter()
    with start_stack(args.work, args.questions, args.max_tokens, "bench-agent-") as stack:
        setup = stack.setup
        # Warm-up: one question through the service (vLLM's first requests are slower).
        asyncio.run(run_service(stack.policy.url, setup.questions[:2], 2, args.max_turns))
        base, trained = active_version(stack.policy), publish_trained(Path(stack.policy.data_dir))
        service32: list[dict] = []
        runs = repeat(lambda i: measure_merged(stack.policy, setup, args, base, trained, i, service32), args.repeat)
        if not args.no_lora_row:
            policy = stack.restart_policy("policy-lora", BRIDGE_POLICY_ADAPTER_SERVING="lora")
            activate(policy, publish_trained(Path(policy.data_dir)))
            asyncio.run(run_service(policy.url, setup.questions[:2], 2, args.max_turns))  # warm-up, as above
            for index, (run, base32) in enumerate(zip(runs, service32, strict=True)):
                print(f"\n=== LoRA serving, repeat {index + 1}/{len(runs)}")
                run["agent_tok_s/trained_lora_over_base@32"] = measure_lora(policy, setup, args, base32)
        context = {"questions": len(setup.questions), "max_turns": args.max_turns, "max_tokens": args.max_tokens}
        finish("agent", args, runs, started, context=context, argv=argv)


if __name__ == "__main__":
    main()
