"""Retrieval as a stochastic policy over M candidates (DESIGN §4).

p_phi(d|q) = softmax(score/temperature) over the candidates. Training rollouts draw the k shown documents
without replacement by Gumbel top-k, which samples an ordered set from the Plackett–Luce distribution;
its log-prob is sum_i [l_{d_i} - logsumexp(l over candidates not yet drawn)]. The retriever serves with the
numpy version; the trainer differentiates the torch one (a test checks they agree).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch


def plackett_luce_logprob(logits: np.ndarray, chosen: Sequence[int]) -> float:
    """log P(chosen, in this order) under Plackett–Luce with the given candidate logits."""
    remaining = np.ones(len(logits), dtype=bool)
    total = 0.0
    for idx in chosen:
        rest = logits[remaining]
        peak = rest.max()
        total += float(logits[idx] - (peak + np.log(np.exp(rest - peak).sum())))
        remaining[idx] = False
    return total


def gumbel_top_k(logits: np.ndarray, k: int, rng: np.random.Generator) -> list[int]:
    """k indices drawn without replacement, in draw order (argsort of logits + Gumbel noise)."""
    perturbed = logits + rng.gumbel(size=logits.shape)
    return [int(i) for i in np.argsort(-perturbed, kind="stable")[:k]]


def query_rng(seed: int | None, position: int) -> np.random.Generator:
    """One stream per (seed, query position), so a query's draw does not depend on its batch-mates."""
    return np.random.default_rng(None if seed is None else [seed, position])


def plackett_luce_logprob_torch(logits: torch.Tensor, chosen: torch.Tensor) -> torch.Tensor:
    """log P(chosen in order | logits) under Plackett–Luce, differentiable in `logits`.

    logits: (M,) candidate scores / temperature; chosen: (k,) indices into the candidates.
    """
    available = torch.ones_like(logits, dtype=torch.bool)
    total = logits.new_zeros(())
    for idx in chosen.tolist():
        total = total + logits[idx] - torch.logsumexp(logits.masked_fill(~available, float("-inf")), dim=0)
        available = available.clone()
        available[idx] = False
    return total
