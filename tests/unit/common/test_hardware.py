"""`dtype="auto"` picks bf16 only where the CPU has it natively (emulated bf16 is ~85x slower on AVX2 only)."""

from __future__ import annotations

import pytest

from services.common.hardware import cpu_flags, native_bf16, parse_cpu_list, resolve_dtype
from services.policy.settings import PolicySettings
from services.retriever.settings import RetrieverSettings


def test_auto_follows_the_cpu_flags(tmp_path):
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text("processor\t: 0\nflags\t\t: fpu sse2 avx2 avx512f avx512_bf16\n")
    flags = cpu_flags.__wrapped__(cpuinfo)
    assert "avx512_bf16" in flags and native_bf16(flags)
    assert resolve_dtype("auto", flags) == "bfloat16"
    assert resolve_dtype("auto", frozenset({"avx2", "fma"})) == "float32"
    assert resolve_dtype("auto", frozenset({"amx_bf16"})) == "bfloat16"
    assert resolve_dtype("float32", flags) == "float32" and resolve_dtype("bfloat16", frozenset()) == "bfloat16"
    assert cpu_flags.__wrapped__(tmp_path / "missing") == frozenset()
    with pytest.raises(ValueError, match="auto, bfloat16 or float32"):
        resolve_dtype("float16")


def test_this_machine_agrees_with_torch():
    torch = pytest.importorskip("torch")
    native = torch.cpu._is_avx512_bf16_supported() or torch.cpu._is_amx_tile_supported()
    assert native_bf16() == native


def test_services_default_to_auto(monkeypatch):
    monkeypatch.delenv("BRIDGE_POLICY_DTYPE", raising=False)
    monkeypatch.delenv("BRIDGE_RETRIEVER_DTYPE", raising=False)
    assert PolicySettings().dtype == "auto" and RetrieverSettings().dtype == "auto"
    monkeypatch.setenv("BRIDGE_RETRIEVER_DTYPE", "float32")
    assert RetrieverSettings().dtype == "float32"


def test_cpu_lists_parse_like_the_kernels(monkeypatch):
    assert parse_cpu_list("1") == {1} and parse_cpu_list("0-3") == {0, 1, 2, 3}
    assert parse_cpu_list("0,2-3") == {0, 2, 3}
    for bad in ("", "a", "3-1", "1-", "-1", "1;2"):
        with pytest.raises(ValueError):
            parse_cpu_list(bad)
    from services.trainer.settings import TrainerSettings

    monkeypatch.setenv("BRIDGE_TRAINER_CPUS", "1")
    assert TrainerSettings().cpu_set == {1}
    monkeypatch.setenv("BRIDGE_TRAINER_CPUS", "one")
    with pytest.raises(ValueError, match="cpu list"):
        TrainerSettings()
