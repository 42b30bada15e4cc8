"""Benches that repeat (issue 31 section 5): run a bench's measurement N times, keep every ratio of every repeat,
and report each ratio's median and spread with the CPU it ran on, on stdout and as JSON.

One run of a bench on a shared 2-core machine moves by 10-20 % (docs/performance.md), so a single ratio cannot
say whether a target is met; the median of a few repeats and their range can.

    add_repeat_arguments(parser, "agent")                       # --repeat N (default 3), --json PATH
    runs = repeat(lambda i: {"qps/ours_over_baseline": ...}, args.repeat)
    finish("agent", args, runs, started, context={"questions": 64})   # prints the summary, writes the JSON

Nothing here imports torch or a model: tools/perf_table.py reads the JSON through this module.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import sys
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from services.common.hardware import BF16_FLAGS, cpu_flags
from services.common.stats import percentile

REPO = Path(__file__).resolve().parents[1]
BENCH_RESULTS = REPO / "docs" / "results" / "bench"  # <bench>.json, what tools/perf_table.py reads
CPUINFO = Path("/proc/cpuinfo")
DEFAULT_REPEAT = 3
# The flags that decide which kernels the benches' models get: bf16 native or emulated (~85x slower, see
# services/common/hardware.py), AMX tiles, AVX-512 or only AVX2.
NOTABLE_FLAGS = ("amx_bf16", "amx_tile", "avx512_bf16", "avx512f", "avx2")

Ratios = dict[str, float]


@dataclass(frozen=True)
class Spread:
    """One ratio over the repeats: its median, range and interquartile range (linear interpolation)."""

    median: float
    low: float
    high: float
    q1: float
    q3: float
    repeats: tuple[float, ...]


def summarize(values: Sequence[float]) -> Spread:
    if not values:
        raise ValueError("a spread of no values")
    return Spread(
        median=percentile(values, 0.5),
        low=min(values),
        high=max(values),
        q1=percentile(values, 0.25),
        q3=percentile(values, 0.75),
        repeats=tuple(values),
    )


def summarize_runs(runs: Sequence[Mapping[str, float]]) -> dict[str, Spread]:
    """Each ratio's spread over the repeats that measured it, in the order the bench first printed them (a ratio
    can be absent from a repeat, e.g. a row that failed)."""
    keys = list(dict.fromkeys(key for run in runs for key in run))
    return {key: summarize([run[key] for run in runs if key in run]) for key in keys}


@dataclass(frozen=True)
class Cpu:
    """What the CPU can do for the benches' models; `cores` is what this process may run on."""

    model: str
    cores: int
    flags: tuple[str, ...]  # the NOTABLE_FLAGS it has

    @property
    def native_bf16(self) -> bool:
        return bool(BF16_FLAGS & set(self.flags))

    def describe(self) -> str:
        """E.g. "AMD EPYC, 2 cores, native bf16 (avx512_bf16)" or "..., 2 cores, no native bf16 (avx2)"."""
        bf16 = "native bf16" if self.native_bf16 else "no native bf16"
        flags = f" ({', '.join(self.flags)})" if self.flags else ""
        return f"{self.model}, {self.cores} cores, {bf16}{flags}"


def cpu_model(cpuinfo: Path = CPUINFO) -> str:
    try:
        for line in cpuinfo.read_text().splitlines():
            if line.startswith(("model name", "Model name")):
                return " ".join(line.split(":", 1)[1].split())
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown CPU"


def usable_cores() -> int:
    # A container or `taskset` can leave a process fewer cores than the machine has; the bench gets those.
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def this_cpu(cpuinfo: Path = CPUINFO) -> Cpu:
    flags = cpu_flags(cpuinfo)
    return Cpu(cpu_model(cpuinfo), usable_cores(), tuple(f for f in NOTABLE_FLAGS if f in flags))


def positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, not {value}")
    return value


def add_repeat_arguments(parser: argparse.ArgumentParser, bench: str, *, cost: str = "") -> None:
    """`--repeat N` and `--json PATH` (default docs/results/bench/<bench>.json); `cost` tells --help what one
    repetition costs where that is long."""
    parser.add_argument("--repeat", type=positive_int, default=DEFAULT_REPEAT, metavar="N",
                        help=f"Measure N times and report each ratio's median and spread (default "
                             f"{DEFAULT_REPEAT}). {cost}".strip())  # fmt: skip
    parser.add_argument("--json", type=Path, default=BENCH_RESULTS / f"{bench}.json", metavar="PATH",
                        help="Write every repeat's ratios, their median and spread, the CPU, the command and the "
                             "wall time here (default: %(default)s; `python -m tools.perf_table --write` "
                             "puts them in docs/performance.md).")  # fmt: skip


def repeat(measure: Callable[[int], Mapping[str, float]], times: int) -> list[Ratios]:
    """`measure(i)` for i in 0..times-1 (each prints its own table as before); its ratios, one dict a repeat."""
    runs = []
    for index in range(times):
        if times > 1:
            print(f"\n=== repeat {index + 1}/{times}", flush=True)
        runs.append(dict(measure(index)))
    return runs


def unit(key: str) -> str:
    """Ratios print as "1.23x"; a key ending in `_s` is seconds (e.g. the seconds a Q sample adds), in `_ms`
    milliseconds, and one naming a share, a cosine or a (relative) difference is a plain number."""
    if key.endswith("_ms"):
        return " ms"
    if key.endswith("_s"):
        return " s"
    return "" if any(word in key for word in ("share", "cosine", "difference")) else "x"


def summary_lines(spreads: Mapping[str, Spread], cpu: Cpu) -> list[str]:
    count = max((len(s.repeats) for s in spreads.values()), default=0)
    lines = [f"\nmedian and spread over {count} repeat{'s' if count != 1 else ''}; CPU: {cpu.describe()}"]
    width = max((len(k) for k in spreads), default=0)
    for key, s in spreads.items():
        u = unit(key)
        each = " ".join(f"{v:.2f}" for v in s.repeats)
        lines.append(f"{key:{width}}  median {s.median:.2f}{u}  min-max {s.low:.2f}-{s.high:.2f}{u}  "
                     f"IQR {s.q1:.2f}-{s.q3:.2f}{u}  ({each})")  # fmt: skip
    return lines


def command_line(bench: str, argv: Sequence[str] | None = None) -> str:
    args = sys.argv[1:] if argv is None else argv
    return shlex.join(["python", "-m", f"bench.{bench}", *args])


def record(bench: str, runs: Sequence[Mapping[str, float]], *, command: str, wall_s: float, cpu: Cpu,
           context: Mapping[str, Any] | None = None) -> dict[str, Any]:  # fmt: skip
    """The JSON a bench writes (lists, not tuples, so it equals what is read back): every repeat's ratios and each
    ratio's median and spread."""
    return {
        "bench": bench,
        "command": command,
        "date": datetime.now(UTC).date().isoformat(),
        "wall_s": round(wall_s, 1),
        "repeat": len(runs),
        "cpu": {**asdict(cpu), "flags": list(cpu.flags), "native_bf16": cpu.native_bf16, "describe": cpu.describe()},
        "context": dict(context or {}),
        "runs": [dict(run) for run in runs],
        "ratios": {key: {**asdict(s), "repeats": list(s.repeats)} for key, s in summarize_runs(runs).items()},
    }


def finish(bench: str, args: argparse.Namespace, runs: Sequence[Mapping[str, float]], started: float,
           context: Mapping[str, Any] | None = None, argv: Sequence[str] | None = None) -> dict[str, Any]:  # fmt: skip
    """Print the median/spread lines and write `args.json`; `started` is the bench's `time.perf_counter()` at the
    start, so the wall time counts set-up (models, services) too."""
    cpu = this_cpu()
    print("\n".join(summary_lines(summarize_runs(runs), cpu)))
    data = record(bench, runs, command=command_line(bench, argv), wall_s=time.perf_counter() - started, cpu=cpu,
                  context=context)  # fmt: skip
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(data, indent=1) + "\n")
    print(f"wrote {args.json}")
    return data


def median_rows(rows: Iterable[Mapping[str, Any]], keys: Sequence[str], values: Sequence[str]) -> list[dict]:
    """One row per distinct `keys`, its `values` the median over the repeats (for a plot of repeated rows); the
    other fields are the first such row's."""
    groups: dict[tuple, list[Mapping[str, Any]]] = {}
    for row in rows:
        groups.setdefault(tuple(row.get(k) for k in keys), []).append(row)
    return [{**group[0], **{v: percentile([r[v] for r in group], 0.5) for v in values}} for group in groups.values()]
