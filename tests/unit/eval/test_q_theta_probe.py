"""The probe's per-step statistics, on a step worked out by hand."""

from __future__ import annotations

import pytest
import torch

import experiments.q_theta_probe as probe


def test_step_stats_by_hand():
    p_phi = torch.tensor([0.7, 0.2, 0.1])
    q_theta = torch.tensor([0.1, 0.3, 0.6])
    gold = torch.tensor([True, False, True])
    row = probe.step_stats(p_phi, q_theta, gold)
    assert row["p_phi"] == pytest.approx(0.8) and row["q_theta"] == pytest.approx(0.7)
    assert row["uniform"] == pytest.approx(2 / 3)
    assert row["top1_phi"] is True and row["top1_q"] is True
    # posterior ∝ p_phi * Q_theta = [0.07, 0.06, 0.06] / 0.19: supporting mass 0.13 / 0.19
    assert row["posterior"] == pytest.approx(0.13 / 0.19) and row["top1_posterior"] is True
    other = probe.step_stats(p_phi, torch.tensor([0.2, 0.5, 0.3]), torch.tensor([True, False, False]))
    assert other["q_theta"] == pytest.approx(0.2) and other["top1_q"] is False
    summary = probe.summarize_steps([row, other])
    assert summary["steps_with_support"] == 2
    assert summary["mass_on_support/p_phi"] == pytest.approx((0.8 + 0.7) / 2)
    assert summary["mass_on_support/q_theta"] == pytest.approx((0.7 + 0.2) / 2)
    assert summary["top1_supporting/q_theta"] == 0.5 and summary["q_theta_above_p_phi"] == 0.0
    assert summary["top1_supporting/posterior"] == 1.0  # other: [0.14, 0.10, 0.03] / 0.27, first is gold
