"""Compiled or eager vLLM on this CPU: what a start costs and what compiling buys (BRIDGE_POLICY_VLLM_ENFORCE_EAGER).

Each repetition starts the vLLM server exactly as the policy service does (VLLMEngine's command and environment:
merged serving, the CPU KV cache, the served dtype) three times, one after another, with nothing else running:
  - compiled, on an empty compile cache (a first start: `bridge-rl up` on a new machine);
  - compiled again, on the cache the first wrote (every later start);
  - eager (--enforce-eager, BRIDGE_POLICY_VLLM_ENFORCE_EAGER=true: what the test suite's services run).
Each is timed from the process start to /health answering, then generates on identical work: `--prompts`
prompts of the demo questions at concurrency 32 and one at a time, exactly `--max-tokens` each (ignore_eos).
Printed as ratios of eager to compiled: start seconds (below 1: eager starts sooner) and tokens/s (below 1: what
not compiling costs a long-lived service, which is why compiled stays the default).

    python -m bench.engine_start [--repeat 3] [--prompts 32] [--max-tokens 64]
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import time
from pathlib import Path

from bench.agent import raw_vllm
from bench.repeat import Ratios, add_repeat_arguments, finish, repeat
from bench.script import DEMO_DATA, prepare_models, script_parser
from services.cli.launcher import free_port
from services.policy.backends.vllm_engine import VLLMEngine
from services.policy.settings import PolicySettings

MODES = {"compiled_cold": False, "compiled_warm": False, "eager": True}  # name: --enforce-eager


async def start_and_measure(model: Path, eager: bool, data_dir: Path, prompts: list[str], max_tokens: int) -> dict:
    """One vLLM start through the service's own engine (its command, environment and health wait; the log in
    <data_dir>/logs); seconds to /health, then tokens/s at concurrency 32 and 1."""
    settings = PolicySettings(model_dir=str(model), vllm_port=free_port(), vllm_enforce_eager=eager,
                              data_dir=data_dir)  # fmt: skip
    engine = VLLMEngine(settings)
    started = time.perf_counter()
    await engine.start()
    try:
        start_s = time.perf_counter() - started
        await raw_vllm(engine.url, prompts[:4], 4, 8, key=engine.api_key)  # warm-up: the first requests are slower
        c32 = await raw_vllm(engine.url, prompts, 32, max_tokens, fixed_length=True, key=engine.api_key)
        c1 = await raw_vllm(engine.url, prompts[:4], 1, max_tokens, fixed_length=True, key=engine.api_key)
    finally:
        await engine.stop()
    return {"start_s": start_s, "tok_s_c32": c32, "tok_s_c1": c1}


def measure(model: Path, prompts: list[str], max_tokens: int, data_dir: Path) -> Ratios:
    # A new data dir: its vllm-cache (the engine's default cache) is empty, so the first compiled start compiles and
    # the second loads it.
    shutil.rmtree(data_dir, ignore_errors=True)
    seen = {}
    for name, eager in MODES.items():
        seen[name] = row = asyncio.run(start_and_measure(model, eager, data_dir, prompts, max_tokens))
        print(f"{name:14} start {row['start_s']:6.1f} s   tokens/s at 32: {row['tok_s_c32']:6.1f}   "
              f"at 1: {row['tok_s_c1']:5.1f}", flush=True)  # fmt: skip
    eager, warm, cold = seen["eager"], seen["compiled_warm"], seen["compiled_cold"]
    return {
        "start/eager_over_compiled_cold": eager["start_s"] / cold["start_s"],
        "start/eager_over_compiled_warm": eager["start_s"] / warm["start_s"],
        "tok_s_c32/eager_over_compiled": eager["tok_s_c32"] / warm["tok_s_c32"],
        "tok_s_c1/eager_over_compiled": eager["tok_s_c1"] / warm["tok_s_c1"],
        "start/compiled_cold_s": cold["start_s"],
        "start/compiled_warm_s": warm["start_s"],
        "start/eager_s": eager["start_s"],
    }


def main(argv: list[str] | None = None) -> None:
    parser = script_parser(__doc__)
    parser.add_argument("--prompts", type=int, default=32, help="Prompts generated at concurrency 32 (default 32).")
    parser.add_argument("--max-tokens", type=int, default=64, help="Tokens generated per prompt, exactly.")
    add_repeat_arguments(parser, "engine_start", cost="One repetition is ~4 min on 2 CPU cores (three starts).")
    args = parser.parse_args(argv)
    started = time.perf_counter()
    models = prepare_models(args.work, retriever=False)
    questions = [json.loads(line)["question"] for line in (DEMO_DATA / "hotpotqa_train.jsonl").open()]
    prompts = [f"Question: {q}\nAnswer:" for q in questions[: args.prompts]]
    os.environ.pop("VLLM_CACHE_ROOT", None)  # the engine's cache must be the run's own, or no start is a first one
    data_dir = args.work / "engine-start"
    runs = repeat(lambda _: measure(models.policy, prompts, args.max_tokens, data_dir), args.repeat)
    context = {"prompts": len(prompts), "max_tokens": args.max_tokens, "model": models.policy.name}
    finish("engine_start", args, runs, started, context=context, argv=argv)


if __name__ == "__main__":
    main()
