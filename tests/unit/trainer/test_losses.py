"""Each loss on inputs small enough to check by hand."""

import math

import pytest
import torch

from services.modeling.plackett_luce import plackett_luce_logprob_torch
from services.trainer.algo.losses import (
    bilevel_correction,
    grpo_advantages,
    grpo_loss,
    masked_mean,
    q_target,
    retrieval_credit_loss,
    retriever_lower_loss,
)


def test_plackett_luce_by_hand():
    logits = torch.log(torch.tensor([1.0, 2.0, 3.0, 4.0]))
    assert float(plackett_luce_logprob_torch(logits, torch.tensor([3, 1]))) == pytest.approx(math.log(4 / 10 * 2 / 6))
    assert float(plackett_luce_logprob_torch(logits, torch.tensor([0]))) == pytest.approx(math.log(1 / 10))


def test_plackett_luce_gradient_by_hand():
    # d/dl_j of [l_0 - logsumexp(l)] = 1[j=0] - softmax_j
    logits = torch.zeros(3, requires_grad=True)
    plackett_luce_logprob_torch(logits, torch.tensor([0])).backward()
    assert torch.allclose(logits.grad, torch.tensor([1 - 1 / 3, -1 / 3, -1 / 3]))


def test_grpo_advantages_by_hand_and_zero_variance():
    rewards = torch.tensor([1.0, 0.0, 1.0, 1.0])  # groups of 2: (1, 0) and (1, 1)
    adv = grpo_advantages(rewards, group_size=2)
    assert torch.allclose(adv[:2], torch.tensor([1.0, -1.0]), atol=1e-5)  # std 0.5 -> +-0.5/0.5
    assert torch.equal(adv[2:], torch.zeros(2))  # no preference, no NaN


def test_token_mask_excludes_observations():
    logps = torch.tensor([[-1.0, -2.0, -3.0]], requires_grad=True)
    mask = torch.tensor([[1.0, 0.0, 1.0]])  # middle token came from the retriever
    loss, _ = grpo_loss(logps, logps.detach(), torch.tensor([1.0]), mask)
    loss.backward()
    assert logps.grad[0, 1] == 0  # no gradient reaches an observation token
    assert torch.allclose(logps.grad[0, [0, 2]], torch.tensor([-0.5, -0.5]))  # -A * ratio / n_tokens
    assert float(loss) == pytest.approx(-1.0)


def test_grpo_clipping_and_fully_masked_sequences():
    logps = torch.log(torch.tensor([[2.0, 0.5]]))
    old = torch.zeros(1, 2)
    loss, stats = grpo_loss(logps, old, torch.tensor([1.0]), torch.ones(1, 2))
    # ratio (2, 0.5), positive advantage: min(r, clip(r)) = (1.2, 0.5) -> loss -(1.2 + 0.5)/2
    assert float(loss) == pytest.approx(-0.85)
    # Only the first token is clipped (its gradient is cut); at 0.5 with A > 0 the min keeps the ratio itself.
    assert stats["clip_ratio/mean"] == pytest.approx(0.5)
    assert stats["clip_ratio/high_mean"] == pytest.approx(0.5) and stats["clip_ratio/low_mean"] == 0.0
    _, negative = grpo_loss(logps, old, torch.tensor([-1.0]), torch.ones(1, 2))
    assert negative["clip_ratio/low_mean"] == pytest.approx(0.5) and negative["clip_ratio/high_mean"] == 0.0
    empty, _ = grpo_loss(logps, old, torch.tensor([1.0]), torch.zeros(1, 2))
    assert float(empty) == 0.0 and float(masked_mean(torch.ones(2), torch.zeros(2))) == 0.0


def test_truncated_importance_weights_scale_the_surrogate_once():
    # Ratio 1 (old = current), A = 1, engine log-probs log(1.5) below the trainer's: each token's surrogate is
    # 1 * 1.5, so the loss is -1.5; a second application (weights on top of a ratio against the engine) would
    # give -2.25 before clipping.
    logps = torch.tensor([[-1.0, -2.0]], requires_grad=True)
    behaviour = logps.detach() - math.log(1.5)
    tis = torch.exp(logps.detach() - behaviour).clamp(max=2.0)
    loss, _ = grpo_loss(logps, logps.detach(), torch.tensor([1.0]), torch.ones(1, 2), tis_weights=tis)
    assert float(loss) == pytest.approx(-1.5)
    loss.backward()
    assert torch.allclose(logps.grad, torch.tensor([[-0.75, -0.75]]))  # -A * w * ratio / n_tokens


def test_grpo_kl_to_reference_is_zero_at_the_reference():
    logps = torch.tensor([[-1.0, -2.0]])
    _, stats = grpo_loss(logps, logps, torch.zeros(1), torch.ones(1, 2), beta=0.1, ref_logps=logps)
    assert stats["kl/mean"] == 0.0


def test_retrieval_credit_is_reinforce_at_phi_old():
    chosen = torch.tensor([-1.0, -2.0], requires_grad=True)
    loss, _ = retrieval_credit_loss(chosen, chosen.detach(), torch.tensor([1.0, -1.0]))
    loss.backward()
    assert float(loss) == pytest.approx(-(1 * 1 + -1 * 1) / 2)  # ratio 1: -mean A
    assert torch.allclose(chosen.grad, torch.tensor([-0.5, 0.5]))  # raise the good one, lower the bad one


def credit_ratios(loss_fn, steps: int = 64) -> list[float]:
    """P_phi(D) / P_phi_old(D) after each of `steps` Adam steps on one batch whose only draw has A = -1."""
    logits = torch.zeros(5, requires_grad=True)  # p_phi over 5 candidates; the draw is candidate 0
    old = torch.log_softmax(logits, -1)[:1].detach()
    optimizer = torch.optim.Adam([logits], lr=0.1)
    ratios = []
    for _ in range(steps):
        optimizer.zero_grad()
        loss_fn(torch.log_softmax(logits, -1)[:1], old, torch.tensor([-1.0])).backward()
        optimizer.step()
        ratios.append(float(torch.exp(torch.log_softmax(logits, -1)[0] - old[0])))
    return ratios


def test_retrieval_credit_is_bounded_under_many_steps_of_a_negative_advantage():
    """Raw A log P drives the draw's probability to ~0 in 64 steps; the clipped surrogate's gradient is 0 once the
    ratio passes 1 - eps, so it stops (Adam's momentum carries it a little further, as in PPO) and stays."""
    raw = credit_ratios(lambda logp, old, adv: -(adv * logp).mean())
    clipped = credit_ratios(lambda logp, old, adv: retrieval_credit_loss(logp, old, adv)[0])
    assert raw[-1] < 1e-4
    assert clipped[-1] > 0.15 and abs(clipped[-1] - clipped[-16]) < 0.01  # converged, far from 0
    _, stats = retrieval_credit_loss(torch.tensor([-3.0]), torch.tensor([-2.0]), torch.tensor([-1.0]))
    assert stats["clip_ratio/retrieval"] == 1.0


def test_lower_level_loss_is_zero_when_p_matches_q():
    q = torch.tensor([[0.2, 0.8]])
    assert float(retriever_lower_loss(q, q.log(), q.log(), mu=0.5)) == pytest.approx(0.0, abs=1e-7)
    assert float(retriever_lower_loss(q, torch.tensor([[0.5, 0.5]]).log(), q.log(), mu=0.0)) > 0


def test_bilevel_correction_equals_its_closed_form():
    torch.manual_seed(0)
    theta = torch.randn(2, 4, requires_grad=True)  # stands in for the policy: answer log-probs per candidate
    log_p_phi = torch.log_softmax(torch.randn(2, 4), -1)
    log_p_z = torch.log_softmax(torch.randn(2, 4), -1)
    beta_q = 0.7

    # Autograd of the definition: grad_theta [g(phi; theta) - g(z; theta)].
    q = q_target(theta, beta_q)
    g_phi = retriever_lower_loss(q, log_p_phi, log_p_phi, mu=0.0)
    g_z = retriever_lower_loss(q, log_p_z, log_p_z, mu=0.0)
    (grad_definition,) = torch.autograd.grad(g_phi - g_z, theta)

    # Closed form: -sum_d grad Q_theta(d) (log p_phi(d) - log p_z(d)), by explicit Jacobian.
    closed = torch.zeros_like(theta)
    for s in range(2):
        for d in range(4):
            (grad_q,) = torch.autograd.grad(q_target(theta, beta_q)[s, d], theta)
            closed -= grad_q * (log_p_phi[s, d] - log_p_z[s, d]) / 2  # mean over the 2 rows
    (grad_surrogate,) = torch.autograd.grad(bilevel_correction(q_target(theta, beta_q), log_p_phi, log_p_z), theta)
    assert torch.allclose(grad_definition, closed, atol=1e-6)
    assert torch.allclose(grad_surrogate, closed, atol=1e-6)


def test_q_target_posterior_reweights_the_prior_by_the_policy():
    # Two candidates; the policy finds y* e^1 times likelier after the second, the retriever prefers the first
    # 3:1. Likelihood alone: [1, e] / (1 + e). Posterior: [3, e] / (3 + e).
    answer_lp = torch.tensor([[0.0, 1.0]])
    log_prior = torch.log(torch.tensor([[0.75, 0.25]]))
    e = math.e
    assert torch.allclose(q_target(answer_lp, 1.0), torch.tensor([[1 / (1 + e), e / (1 + e)]]))
    assert torch.allclose(q_target(answer_lp, 1.0, log_prior), torch.tensor([[3 / (3 + e), e / (3 + e)]]))
    # beta_Q tempers the likelihood only: at beta_Q -> large the posterior is the prior itself
    assert torch.allclose(q_target(answer_lp, 1e6, log_prior), torch.tensor([[0.75, 0.25]]), atol=1e-5)


def test_numpy_and_torch_plackett_luce_agree():
    """The retriever serves with the numpy log-prob, the trainer differentiates the torch one: same numbers."""
    import numpy as np

    from services.modeling.plackett_luce import gumbel_top_k, plackett_luce_logprob

    rng = np.random.default_rng(0)
    for _ in range(20):
        logits = rng.normal(size=12) * 5
        chosen = gumbel_top_k(logits, 4, rng)
        torch_value = plackett_luce_logprob_torch(torch.tensor(logits), torch.tensor(chosen))
        assert float(torch_value) == pytest.approx(plackett_luce_logprob(logits, chosen), abs=1e-9)


def test_default_round_fits_the_retriever_to_the_posterior():
    """The default target is the posterior (the paper's L_RAG at beta_Q 1), not the likelihood alone, which a weak
    policy's retriever unlearns from (docs/results.md, section 19)."""
    from types import SimpleNamespace

    from services.trainer.algo.batch import QSample
    from services.trainer.algo.config import AlgoConfig
    from services.trainer.algo.round import compute_q

    answer_lp = torch.tensor([0.0, 1.0])
    log_prior = torch.log(torch.tensor([0.75, 0.25]))
    policy = SimpleNamespace(answer_logprobs=lambda contexts, answer: answer_lp)
    sample = QSample(search=0, candidates=[0, 1], context_ids=[[1], [2]], answer_ids=[3], log_prior=log_prior)
    batch = SimpleNamespace(q_samples=[sample])
    e = math.e
    assert torch.allclose(compute_q(policy, batch, AlgoConfig()), torch.tensor([[3 / (3 + e), e / (3 + e)]]))
    likelihood = compute_q(policy, batch, AlgoConfig(q_prior=False))
    assert torch.allclose(likelihood, torch.tensor([[1 / (1 + e), e / (1 + e)]]))
