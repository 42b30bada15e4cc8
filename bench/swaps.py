"""Does anything accumulate over swaps (issue 31 section 1)? vLLM's raw tokens/s on identical work after each of
`--swaps` in-place reloads, against the same measurement repeated with no swap at all.

One policy service (merged serving, as `bench.agent`: the shipped warm-start LoRA published as the trained
checkpoint) and its vLLM; every measurement is the same `--prompts` prompts at concurrency 32, exactly
`--max-tokens` generated each (ignore_eos), so the weights change nothing but the weights. First the control:
`--swaps` + 1 measurements of the base with nothing reloaded (does the machine itself drift over the minutes a
series takes?); then the series: base, then trained, base, trained, ... (`--swaps` activations), measured after
each. A later measurement of the same weights slower than the first, in the series and not in the control, is
what a swap leaves behind.

    python -m bench.swaps [--swaps 10] [--repeat 1]
"""

from __future__ import annotations

import asyncio
import statistics
import time
from pathlib import Path

from bench.agent import activate, active_version, publish_trained, raw_vllm, start_stack
from bench.repeat import Ratios, add_repeat_arguments, finish, repeat
from bench.script import script_parser


def tok_s(vllm_url: str, prompts: list[str], max_tokens: int, key: str) -> float:
    return asyncio.run(raw_vllm(vllm_url, prompts, 32, max_tokens, fixed_length=True, key=key))


def series(policy, vllm_url: str, prompts: list[str], args, base: str, trained: str) -> Ratios:
    """The control, then the swap series; prints both, returns the ratios of their last measurements to their
    first (per weights)."""
    control = [tok_s(vllm_url, prompts, args.max_tokens, args.vllm_key) for _ in range(args.swaps + 1)]
    print(f"control, no swap, {len(control)} measurements of the base: " + " ".join(f"{v:.0f}" for v in control))
    seen: dict[str, list[float]] = {base: [], trained: []}
    activate(policy, base)
    seen[base].append(tok_s(vllm_url, prompts, args.max_tokens, args.vllm_key))
    for k in range(1, args.swaps + 1):
        version = trained if k % 2 else base
        started = time.perf_counter()
        activate(policy, version)
        reload_s = time.perf_counter() - started
        value = tok_s(vllm_url, prompts, args.max_tokens, args.vllm_key)
        seen[version].append(value)
        print(f"swap {k:2d}: {version:8} reload {reload_s:5.1f} s, {value:6.1f} tok/s", flush=True)
    ratios = {
        "tok_s/control_last_over_first": control[-1] / control[0],
        "tok_s/base_last_over_first_across_swaps": seen[base][-1] / seen[base][0],
        "tok_s/trained_last_over_first_across_swaps": seen[trained][-1] / seen[trained][0],
        "tok_s/trained_over_base_median_across_swaps": statistics.median(seen[trained]) / statistics.median(seen[base]),
    }
    for key, value in ratios.items():
        print(f"{key}: {value:.2f}x")
    return ratios


def main(argv: list[str] | None = None) -> None:
    parser = script_parser(__doc__)
    parser.add_argument("--swaps", type=int, default=10, help="In-place reloads in the series (default 10).")
    parser.add_argument("--prompts", type=int, default=32, help="Prompts per measurement (concurrency 32).")
    parser.add_argument("--max-tokens", type=int, default=48, help="Tokens generated per prompt, exactly.")
    cost = "One repetition (control + series) is ~2 min on 2 CPU cores, after ~1 min of start-up."
    add_repeat_arguments(parser, "swaps", cost=cost)
    args = parser.parse_args(argv)
    started = time.perf_counter()
    with start_stack(args.work, args.prompts, args.max_tokens, "bench-swaps-") as stack:
        policy, vllm_url, prompts = stack.policy, stack.setup.vllm_url, stack.setup.prompts
        args.vllm_key = stack.setup.vllm_key
        tok_s(vllm_url, prompts[:4], 8, args.vllm_key)  # warm-up: vLLM's first requests are slower
        base, trained = active_version(policy), publish_trained(Path(policy.data_dir))
        runs = repeat(lambda _: series(policy, vllm_url, prompts, args, base, trained), args.repeat)
        context = {"swaps": args.swaps, "prompts": len(prompts), "max_tokens": args.max_tokens}
        finish("swaps", args, runs, started, context=context, argv=argv)


if __name__ == "__main__":
    main()
