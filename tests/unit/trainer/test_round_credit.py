"""The retrieval credit's denominator in a whole round, on a two-dimensional query tower (no model needed): the
trainer's P_phi_old(D), never the service's behaviour log-prob (that enters once, through the truncated weight)
nor the current P_phi(D) (a ratio of 1 at every step, so the clip would never act)."""

from __future__ import annotations

import math

import pytest
import torch

from services.modeling.plackett_luce import plackett_luce_logprob_torch
from services.trainer.algo import round as round_module
from services.trainer.algo.batch import RoundBatch, SearchSample
from services.trainer.algo.config import AlgoConfig
from services.trainer.algo.round import train_round
from services.trainer.device import Placement

DOCS = {"a": [1.0, 0.0], "b": [0.0, 1.0], "c": [-1.0, 0.5]}
QUERIES = {"q0": [0.5, 0.2], "q1": [-0.3, 0.4]}
TEMPERATURE = 0.5


class QueryTower(torch.nn.Module):
    """A query tower with one trainable vector per query text; called as `SentenceEncoder` is, on a list."""

    def __init__(self) -> None:
        super().__init__()
        self.rows = {query: n for n, query in enumerate(QUERIES)}
        self.vectors = torch.nn.Parameter(torch.tensor(list(QUERIES.values())))  # (Q, H)

    def forward(self, texts: list[str]) -> torch.Tensor:
        return self.vectors[[self.rows[t] for t in texts]]  # (S, H)


class TinyRetriever:
    """What a round uses of `RetrieverModel`: the query tower, its placement, frozen e_d and the trainable set."""

    def __init__(self) -> None:
        self.query = QueryTower()
        self.placement = Placement.cpu()

    def doc_vectors(self, ids: list[str], texts: dict[str, str]) -> torch.Tensor:
        return torch.tensor([DOCS[i] for i in ids])  # (M, H)

    @staticmethod
    def trainable(encoder: torch.nn.Module) -> list[torch.nn.Parameter]:
        return [p for p in encoder.parameters() if p.requires_grad]


def search(trajectory: int, query: str, chosen: list[int], behaviour_shift: float) -> SearchSample:
    """A sampled search whose behaviour log-prob is `behaviour_shift` nats off the trainer's phi_old score."""
    return SearchSample(
        trajectory=trajectory, query=query, candidate_ids=list(DOCS), deployed_scores=torch.zeros(len(DOCS)),
        chosen=torch.tensor(chosen), temperature=TEMPERATURE,
        behaviour_logprob=float(old_logprob(query, chosen)) + behaviour_shift,
    )  # fmt: skip


def old_logprob(query: str, chosen: list[int]) -> torch.Tensor:
    """log P_phi_old(D | q, C) by hand: Plackett-Luce over <e_q, e_d> / T at the tower's starting vectors."""
    logits = torch.tensor(list(DOCS.values())) @ torch.tensor(QUERIES[query]) / TEMPERATURE
    return plackett_luce_logprob_torch(logits, torch.tensor(chosen))


def test_the_credit_divides_by_phi_old_not_the_behaviour_nor_the_current_score(monkeypatch):
    seen: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = []
    loss_fn = round_module.retrieval_credit_loss

    def recording(chosen, old, advantages, weights, **clip):  # what each of the K steps hands the loss
        seen.append((chosen.detach().clone(), old.clone(), weights.clone()))
        return loss_fn(chosen, old, advantages, weights, **clip)

    monkeypatch.setattr(round_module, "retrieval_credit_loss", recording)
    shifts = torch.tensor([0.3, -0.2])
    batch = RoundBatch(
        records=[], rewards=torch.tensor([1.0, 0.0]), advantages=torch.tensor([1.0, -1.0]),
        searches=[search(0, "q0", [0, 1], float(shifts[0])), search(1, "q1", [2], float(shifts[1]))],
        q_samples=[], doc_texts={},
    )  # fmt: skip
    cfg = AlgoConfig(algo="retriever-only", retriever_objective="credit", retriever_steps=2, retriever_lr=0.05,
                     retrieval_clip=0.5, max_grad_norm=0.0, lr_schedule="constant", tis_cap=2.0)  # fmt: skip
    # retriever-only on the credit alone with no Q samples: the round never touches the policy
    stats = train_round(None, TinyRetriever(), batch, cfg, lam=1.0)  # type: ignore[arg-type]

    p_old = torch.stack([old_logprob("q0", [0, 1]), old_logprob("q1", [2])])
    behaviour = torch.tensor([s.behaviour_logprob for s in batch.searches])
    assert len(seen) == cfg.retriever_steps
    (first_chosen, first_old, weights), (current, old, _) = seen
    # the three candidates for the denominator differ: the behaviour by the shifts, phi by its first step
    assert torch.allclose(behaviour - p_old, shifts, atol=1e-5)
    assert (current - p_old).abs().min() > 1e-2
    # the denominator is phi_old's score at every step: the ratio is exactly 1 at the first, not after it
    assert torch.allclose(first_old, p_old, atol=1e-5) and torch.allclose(old, p_old, atol=1e-5)
    assert torch.allclose(first_chosen, p_old, atol=1e-5)
    # the behaviour log-prob enters only through min(cap, P_phi_old / P_behaviour)
    assert torch.allclose(weights, torch.exp(-shifts), atol=1e-5)
    # and the last step's credit, by hand, on P_phi / P_phi_old
    ratio = torch.exp(current - p_old)
    assert stats["ratio/retrieval_mean"] == pytest.approx(float(ratio.mean()), rel=1e-5)
    assert not math.isclose(stats["ratio/retrieval_mean"], 1.0, abs_tol=1e-3)
    advantages = batch.advantages
    surrogate = torch.min(ratio * advantages, ratio.clamp(0.5, 1.5) * advantages) * weights
    assert stats["loss/retriever"] == pytest.approx(float(-surrogate.mean()), rel=1e-5)
