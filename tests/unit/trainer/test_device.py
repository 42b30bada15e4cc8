"""The trainer's device placement: what `auto` resolves to, a GPU that is not there refused with the reason, and
a round trained through the placement path (models moved, factory tensors in its scope, bf16 autocast on the
forwards) on the CPU, the only device this suite can count on."""

from __future__ import annotations

import math

import pytest
import torch

from services.common.hardware import native_bf16
from services.trainer.algo.batch import build_batch
from services.trainer.algo.config import AlgoConfig
from services.trainer.algo.round import train_round
from services.trainer.device import DeviceUnavailable, Placement, resolve_autocast, resolve_device
from services.trainer.models import PolicyModel, RetrieverModel
from services.trainer.retry import is_transient
from services.trainer.settings import TrainerSettings
from tests.unit.trainer.test_round import DOCS, make_records, moved, snapshot

CPU = torch.device("cpu")


def test_auto_is_the_gpu_when_torch_sees_one_else_the_cpu():
    expected = "cuda" if torch.cuda.is_available() else "cpu"
    assert resolve_device("auto").type == expected
    assert resolve_device("cpu") == CPU


@pytest.mark.skipif(torch.cuda.is_available(), reason="a GPU is there")
@pytest.mark.parametrize("spec", ["cuda", "cuda:0", "cuda:3"])
def test_a_gpu_that_is_not_there_is_refused_with_the_reason(spec):
    with pytest.raises(DeviceUnavailable, match="sees no CUDA GPU") as error:
        resolve_device(spec)
    assert not is_transient(error.value)  # a retry would fail the same way: the run fails with this reason


@pytest.mark.parametrize("spec", ["tpu", "gpu", "mps", ""])
def test_a_device_the_trainer_does_not_run_on_is_refused(spec):
    with pytest.raises(DeviceUnavailable):
        resolve_device(spec)


def test_autocast_is_bf16_where_native_and_float32_for_the_rl_trainer_on_the_cpu():
    assert resolve_autocast(CPU, "auto") is None  # the recorded results' numerics
    assert resolve_autocast(CPU, "auto", cpu_bf16=True) == (torch.bfloat16 if native_bf16() else None)
    assert resolve_autocast(CPU, "bfloat16") == torch.bfloat16
    assert resolve_autocast(CPU, "float32", cpu_bf16=True) is None
    with pytest.raises(ValueError, match="precision"):
        resolve_autocast(CPU, "fp16")  # type: ignore[arg-type]


def test_settings_name_the_device_and_precision(monkeypatch):
    monkeypatch.setenv("BRIDGE_TRAINER_DEVICE", "cuda:1")
    monkeypatch.setenv("BRIDGE_TRAINER_PRECISION", "float32")
    settings = TrainerSettings()
    assert (settings.device, settings.precision) == ("cuda:1", "float32")
    monkeypatch.setenv("BRIDGE_TRAINER_PRECISION", "half")
    with pytest.raises(ValueError):
        TrainerSettings()


def test_scope_makes_the_rounds_tensors_on_the_device():
    with Placement(torch.device("meta")).scope():
        assert torch.tensor([1.0]).device.type == "meta" and torch.zeros(2).device.type == "meta"
    assert torch.tensor([1.0]).device == CPU


@pytest.mark.slow
def test_a_round_through_the_placement_path_with_bf16_autocast(policy_models_root):
    """The same code a GPU round runs: models placed, the batch built and the round trained inside the scope,
    forwards under bf16 autocast. Weights and optimizer state stay float32; losses finite; the right parts move;
    the first policy step's ratio is exactly 1 (theta_old's log-probs are the same autocast forward)."""
    placement = Placement(CPU, torch.bfloat16)
    torch.manual_seed(0)
    policy = PolicyModel(policy_models_root / "SmolLM2-135M-Instruct", None, rank=4, alpha=8, placement=placement)
    retriever = RetrieverModel(policy_models_root / "all-MiniLM-L6-v2", None, placement=placement)
    cfg = AlgoConfig(algo="bridge", group_size=2, q_steps=1, q_candidates=2, retriever_steps=1, policy_lr=1e-3,
                     retriever_lr=1e-4, policy_steps=1)  # fmt: skip
    with placement.scope():
        batch = build_batch(make_records(policy, retriever), cfg, policy.tokenizer, DOCS)
        before_policy, before_phi = snapshot(policy.parameters()), snapshot(list(retriever.query.parameters()))
        stats = train_round(policy, retriever, batch, cfg, lam=1.0)
    assert all(math.isfinite(v) for v in stats.values()), stats
    assert moved(before_policy, policy.parameters()) and moved(before_phi, list(retriever.query.parameters()))
    assert stats["clip_ratio/mean"] == 0.0
    assert {p.dtype for p in policy.parameters()} == {torch.float32}
    assert {p.dtype for p in retriever.query.parameters()} == {torch.float32}
    assert {p.device for p in policy.model.parameters()} == {CPU}
