"""What the CPU can do fast, read without importing torch (settings resolve `dtype="auto"` from it).

bf16 matmuls are fast only with native support (AVX512-BF16 or AMX); elsewhere PyTorch emulates them, and on an
AVX2-only EPYC a bf16 matmul measured 1.3 GFLOP/s against 113 for fp32 (85x slower; the encoder ingested 6
passages/s instead of ~70). So "auto" picks bf16 only where the flags say it is native.
"""

from __future__ import annotations

import re
from functools import cache
from pathlib import Path
from typing import Literal

Precision = Literal["bfloat16", "float32"]
BF16_FLAGS = frozenset({"avx512_bf16", "amx_bf16"})


@cache
def cpu_flags(cpuinfo: Path = Path("/proc/cpuinfo")) -> frozenset[str]:
    try:
        for line in cpuinfo.read_text().splitlines():
            if line.startswith(("flags", "Features")):
                return frozenset(line.split(":", 1)[1].split())
    except OSError:
        pass
    return frozenset()


def native_bf16(flags: frozenset[str] | None = None) -> bool:
    return bool((cpu_flags() if flags is None else flags) & BF16_FLAGS)


def resolve_dtype(dtype: str, flags: frozenset[str] | None = None) -> Precision:
    """`auto` -> bfloat16 where the CPU has native bf16, else float32; an explicit dtype is kept."""
    if dtype == "auto":
        return "bfloat16" if native_bf16(flags) else "float32"
    if dtype not in ("bfloat16", "float32"):
        raise ValueError(f"dtype must be auto, bfloat16 or float32, not {dtype!r}")
    return dtype  # type: ignore[return-value]


def parse_cpu_list(spec: str) -> set[int]:
    """`"1"`, `"0-3"`, `"0,2-3"` (the kernel's and vLLM's cpu-list form) -> the set of core ids."""
    cores: set[int] = set()
    for part in spec.split(","):
        bounds = re.fullmatch(r"\s*(\d+)(?:-(\d+))?\s*", part)
        low, high = (int(bounds[1]), int(bounds[2] or bounds[1])) if bounds else (1, 0)
        if high < low:
            raise ValueError(f"not a cpu list (e.g. 1, 0-3, 0,2-3): {spec!r}")
        cores.update(range(low, high + 1))
    return cores


def gpu_available() -> bool:
    """A CUDA device torch can use (imports torch: ask where it is loaded anyway, as the policy service does)."""
    import torch

    return torch.cuda.is_available()
