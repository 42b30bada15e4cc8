"""The optimizers' schedule, clipping and their state's round trip through safetensors."""

from __future__ import annotations

import pytest
import torch

from services.trainer.algo.optim import TrainOptimizer, lr_factor


def test_lr_factor_warms_up_then_decays_linearly():
    assert [lr_factor(s, 10, 2, "linear") for s in range(4)] == pytest.approx([0.5, 1.0, 1.0 * 8 / 8, 7 / 8])
    assert lr_factor(9, 10, 2, "linear") == pytest.approx(1 / 8)
    assert [lr_factor(s, 10, 0, "constant") for s in (0, 5, 9)] == [1.0, 1.0, 1.0]


def test_gradient_norm_is_clipped_and_reported():
    param = torch.nn.Parameter(torch.zeros(2))
    opt = TrainOptimizer([param], lr=0.1, max_grad_norm=1.0)
    param.grad = torch.tensor([3.0, 4.0])
    assert opt.step() == pytest.approx(5.0)
    assert torch.allclose(param.grad, torch.tensor([0.6, 0.8]))  # clipped to norm 1 before the step


def test_state_round_trip_continues_exactly(tmp_path):
    """Two steps in one optimizer == one step, save, a new optimizer loads, one more step."""
    torch.manual_seed(0)
    start = torch.randn(3)
    grads = [torch.randn(3), torch.randn(3)]

    def fresh() -> tuple[torch.nn.Parameter, TrainOptimizer]:
        param = torch.nn.Parameter(start.clone())
        return param, TrainOptimizer([param], lr=0.1, total_steps=2, schedule="linear", max_grad_norm=10.0)

    one, opt = fresh()
    for g in grads:
        one.grad = g.clone()
        opt.step()

    two, first = fresh()
    two.grad = grads[0].clone()
    first.step()
    first.save(tmp_path / "opt.safetensors")
    resumed_param = torch.nn.Parameter(two.detach().clone())
    second = TrainOptimizer([resumed_param], lr=0.1, total_steps=2, schedule="linear", max_grad_norm=10.0)
    second.load(tmp_path / "opt.safetensors")
    assert second.steps == 1
    resumed_param.grad = grads[1].clone()
    second.step()
    assert torch.equal(resumed_param.detach(), one.detach())
