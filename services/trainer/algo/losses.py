"""BRIDGE's objectives as pure functions of tensors (DESIGN §4). No modules, optimisers, logging or I/O.

Symbols follow the design notes: A_i group-normalised advantages, p_phi the retriever's softmax over the
M candidates, Q_theta the LM-supervised target over the same candidates, z the lower-level proxy copy.
"""

from __future__ import annotations

import torch


def masked_mean(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean over masked entries; an all-masked input gives 0 (the clamp), never NaN."""
    return (values * mask).sum() / mask.sum().clamp(min=1)


def masked_mean_per_sequence(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return (values * mask).sum(-1) / mask.sum(-1).clamp(min=1)  # (B,)


def grpo_advantages(rewards: torch.Tensor, group_size: int, eps: float = 1e-6) -> torch.Tensor:
    """A_i = (r_i - mean_group r) / (std_group r + eps) over groups of `group_size` consecutive rewards.

    A group whose rewards are all equal carries no preference: its advantages are exactly 0 (not NaN).
    """
    grouped = rewards.view(-1, group_size)  # (G_count, G)
    mean = grouped.mean(dim=1, keepdim=True)
    std = grouped.std(dim=1, unbiased=False, keepdim=True)
    return ((grouped - mean) / (std + eps)).view(-1)


def grpo_loss(
    logps: torch.Tensor,
    old_logps: torch.Tensor,
    advantages: torch.Tensor,
    completion_mask: torch.Tensor,
    *,
    eps_low: float = 0.2,
    eps_high: float = 0.2,
    beta: float = 0.0,
    ref_logps: torch.Tensor | None = None,
    sequence_weights: torch.Tensor | None = None,
    tis_weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """Clipped GRPO surrogate on policy-generated tokens plus beta * KL to the reference (k3 estimator).

    logps, old_logps, ref_logps, completion_mask, tis_weights: (B, T); advantages, sequence_weights: (B,).
    `completion_mask` is 1 on generated tokens only: prompt and retrieved <information> tokens are 0.
    `old_logps` are the trainer's own log-probs under theta_old (so the ratio is exactly 1 at the first step);
    `tis_weights` = min(cap, pi_old / pi_behaviour) per token corrects for the engine that sampled (verl's TIS)
    and multiplies the surrogate only, not the KL term.
    """
    ratio = torch.exp(logps - old_logps)  # (B, T)
    clipped_ratio = torch.clamp(ratio, 1 - eps_low, 1 + eps_high)
    per_token_surrogate = torch.min(ratio * advantages[:, None], clipped_ratio * advantages[:, None])
    if tis_weights is not None:
        per_token_surrogate = per_token_surrogate * tis_weights
    per_token_loss = -per_token_surrogate
    per_token_kl = torch.zeros_like(logps)
    if beta and ref_logps is not None:
        per_token_kl = torch.exp(ref_logps - logps) - (ref_logps - logps) - 1
        per_token_loss = per_token_loss + beta * per_token_kl
    per_sequence = masked_mean_per_sequence(per_token_loss, completion_mask)  # (B,)
    if sequence_weights is not None:
        per_sequence = per_sequence * sequence_weights
    has_tokens = (completion_mask.sum(-1) > 0).float()
    loss = (per_sequence * has_tokens).sum() / has_tokens.sum().clamp(min=1)
    with torch.no_grad():
        # Clipped = the min picked the clipped branch, so no gradient flows (TRL's is_low/high_clipped):
        # below 1 - eps_low with A < 0, above 1 + eps_high with A > 0.
        low_clipped = ((ratio < 1 - eps_low) & (advantages[:, None] < 0)).float()
        high_clipped = ((ratio > 1 + eps_high) & (advantages[:, None] > 0)).float()
        stats = {
            "loss/policy": float(loss),
            "kl/mean": float(masked_mean(per_token_kl, completion_mask)),
            "clip_ratio/low_mean": float(masked_mean(low_clipped, completion_mask)),
            "clip_ratio/high_mean": float(masked_mean(high_clipped, completion_mask)),
            "clip_ratio/mean": float(masked_mean(low_clipped + high_clipped, completion_mask)),
        }
    return loss, stats


def retrieval_credit_loss(
    chosen_logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    weights: torch.Tensor | None = None,
    *,
    eps_low: float = 0.2,
    eps_high: float = 0.2,
) -> tuple[torch.Tensor, dict[str, float]]:
    """phi-part of f as a clipped surrogate (PPO on the retrieval action), one row per sampled search:

        ratio = P_phi(D | q, C) / P_phi_old(D | q, C)
        -mean_{i,t} w_{i,t} min(ratio A_i, clip(ratio, 1 - eps_low, 1 + eps_high) A_i)

    Its gradient at phi = phi_old is REINFORCE's, -mean w A grad log P_phi; past the clip it is 0, so K steps
    on one batch cannot push a negative-advantage draw's log P down without limit as raw A log P_phi does.
    `weights`: truncated min(cap, P_phi_old(D) / P_behaviour(D)) per row, for draws the trainer did not make."""
    if chosen_logprobs.numel() == 0:
        return chosen_logprobs.new_zeros(()), {}
    ratio = torch.exp(chosen_logprobs - old_logprobs)  # (S,)
    clipped_ratio = torch.clamp(ratio, 1 - eps_low, 1 + eps_high)
    surrogate = torch.min(ratio * advantages, clipped_ratio * advantages)
    if weights is not None:
        surrogate = surrogate * weights
    with torch.no_grad():
        clipped = ((ratio < 1 - eps_low) & (advantages < 0)) | ((ratio > 1 + eps_high) & (advantages > 0))
        stats = {"clip_ratio/retrieval": float(clipped.float().mean()), "ratio/retrieval_mean": float(ratio.mean())}
    return -surrogate.mean(), stats


def q_target(answer_logprobs: torch.Tensor, beta_q: float, log_prior: torch.Tensor | None = None) -> torch.Tensor:
    """Q_theta(d) ∝ exp(log pi_theta(y* | x, d) / beta_Q) over the candidates; (S, M) -> (S, M).

    With `log_prior` (log p_deployed over the same candidates) it is the posterior p_deployed(d) pi(y*|x,d)^(1/beta_Q)
    / Z: the policy re-weights the serving retriever's belief instead of replacing it (docs/results.md, section 3)."""
    logits = answer_logprobs / beta_q
    return torch.softmax(logits if log_prior is None else logits + log_prior, dim=-1)


def kl(p: torch.Tensor, log_p: torch.Tensor, log_q: torch.Tensor) -> torch.Tensor:
    """Mean over rows of KL(p || q) = sum p (log p - log q); rows are distributions over candidates."""
    return (p * (log_p - log_q)).sum(-1).mean()


def retriever_lower_loss(
    q_theta: torch.Tensor,
    log_p_phi: torch.Tensor,
    log_p_deployed: torch.Tensor,
    mu: float,
) -> torch.Tensor:
    """g(phi; theta) = KL(Q_theta || p_phi) + mu * KL(p_deployed || p_phi); all (S, M)."""
    log_q = torch.log(q_theta.clamp(min=1e-12))
    loss = kl(q_theta, log_q, log_p_phi)
    if mu:
        loss = loss + mu * kl(log_p_deployed.exp(), log_p_deployed, log_p_phi)
    return loss


def rag_theta_term(q_theta: torch.Tensor, log_p_phi: torch.Tensor) -> torch.Tensor:
    """The theta-dependent part of g(phi; theta) = KL(Q_theta || p_phi) with log p_phi constant: its
    theta-gradient is grad_theta g(phi; theta) (the `drop` estimator's extra term, and `joint`'s)."""
    log_q = torch.log(q_theta.clamp(min=1e-12))
    return kl(q_theta, log_q, log_p_phi.detach())


def bilevel_correction(q_theta: torch.Tensor, log_p_phi: torch.Tensor, log_p_z: torch.Tensor) -> torch.Tensor:
    """A surrogate whose theta-gradient is grad_theta g(phi; theta) - grad_theta g(z; theta).

    That difference is -sum_d grad Q_theta(d) (log p_phi(d) - log p_z(d)): log p terms are constants here.
    """
    return -(q_theta * (log_p_phi - log_p_z).detach()).sum(-1).mean()
