"""Where the trainer computes: a device (`auto` picks the first CUDA GPU when torch sees one) and the autocast dtype
of its forward passes (bf16 where it is native: any CUDA GPU with bf16, Ampere and later).

The round's own small tensors (rewards, ratios, masks) are made inside `Placement.scope()`, torch's default-device
context, so no line of the round names a device; the models are moved once, and the encoder moves its inputs.
On the CPU `auto` keeps float32: every RL figure in docs/results.md was measured so, and bf16 ratios would not
be exactly 1 at no change.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Literal

import torch

from services.common.hardware import native_bf16

DeviceSpec = str  # "auto", "cpu", "cuda", "cuda:N"
PrecisionSpec = Literal["auto", "bfloat16", "float32"]


class DeviceUnavailable(ValueError):
    """A configured device torch cannot use (a CUDA device on a CPU-only torch, a GPU index beyond the count)."""


def resolve_device(spec: DeviceSpec = "auto") -> torch.device:
    """`auto` -> cuda:0 when torch sees a GPU, else cpu; `cpu`, `cuda`, `cuda:N` are checked, never guessed."""
    if spec == "auto":
        return torch.device("cuda:0" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(spec)
    except RuntimeError as error:
        raise DeviceUnavailable(f"not a device (auto, cpu, cuda, cuda:N): {spec!r}") from error
    if device.type == "cpu":
        return device
    if device.type != "cuda":
        raise DeviceUnavailable(f"the trainer runs on cpu or cuda, not {device.type!r}")
    if not torch.cuda.is_available():
        raise DeviceUnavailable(
            f"device {spec!r} asked for, but this torch sees no CUDA GPU (torch {torch.__version__}; a CPU build, "
            "or no driver): install a CUDA torch, or set the device to auto or cpu"
        )
    index = 0 if device.index is None else device.index
    if index >= torch.cuda.device_count():
        raise DeviceUnavailable(f"device {spec!r}: this machine has {torch.cuda.device_count()} CUDA GPU(s)")
    return torch.device("cuda", index)


def resolve_autocast(device: torch.device, precision: PrecisionSpec = "auto", *, cpu_bf16: bool = False):
    """The autocast dtype of forward passes on `device`, or None (float32 throughout).

    `auto`: bf16 on a CUDA GPU that supports it; on the CPU bf16 only if `cpu_bf16` (the warm start's SFT, where
    the CPU has it natively) and float32 otherwise. `bfloat16` forces it (emulated bf16 on an AVX2-only CPU is
    ~85x slower than fp32: services/common/hardware)."""
    if precision == "float32":
        return None
    if precision == "bfloat16":
        return torch.bfloat16
    if precision != "auto":
        raise ValueError(f"precision must be auto, bfloat16 or float32, not {precision!r}")
    if device.type == "cuda":
        return torch.bfloat16 if torch.cuda.is_bf16_supported() else None
    return torch.bfloat16 if cpu_bf16 and native_bf16() else None


@dataclass(frozen=True)
class Placement:
    device: torch.device
    autocast: torch.dtype | None = None

    @classmethod
    def cpu(cls) -> Placement:
        return cls(torch.device("cpu"))

    @classmethod
    def resolve(cls, device: DeviceSpec = "auto", precision: PrecisionSpec = "auto", *, cpu_bf16: bool = False):
        where = resolve_device(device)
        return cls(where, resolve_autocast(where, precision, cpu_bf16=cpu_bf16))

    def forward(self) -> contextlib.AbstractContextManager:
        """Around a model's forward (never its backward, as torch.autocast asks)."""
        if self.autocast is None:
            return contextlib.nullcontext()
        return torch.autocast(self.device.type, dtype=self.autocast)

    @contextlib.contextmanager
    def scope(self) -> Iterator[None]:
        """Tensors made by torch's factory functions in this block (torch.tensor, zeros, the tokenizer's) land on
        the device."""
        with torch.device(self.device):
            yield

    def describe(self) -> str:
        dtype = "float32" if self.autocast is None else f"{str(self.autocast).removeprefix('torch.')} autocast"
        return f"{self.device} ({dtype})"
