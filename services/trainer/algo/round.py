"""One training round for every algorithm behind `--algo` (DESIGN §4), reading top to bottom.

bridge:  z <- phi, K steps on g(z; theta)                                (lower-level value proxy)
         K steps phi <- phi - eta (grad_phi f / lambda + grad_phi g(phi; theta))   (retriever FIRST)
         theta <- theta - alpha (grad_theta f + lambda (grad_theta g(phi) - grad_theta g(z)))
         lambda <- min(lambda + delta, lambda_max)
The others drop or reorder pieces of the same code: search-r1 (theta only), retriever-only (phi only),
alt-rp (phi then theta, no coupling), alt-pr (theta then phi), joint (one simultaneous step on f + g).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

from services.retriever.backends.encoder import SentenceEncoder
from services.trainer.algo.batch import QSample, RoundBatch
from services.trainer.algo.config import AlgoConfig
from services.trainer.algo.losses import (
    bilevel_correction,
    grpo_loss,
    plackett_luce_logprob,
    q_target,
    retrieval_credit_loss,
    retriever_lower_loss,
)
from services.trainer.models import PolicyModel, RetrieverModel


# ----------------------------------------------------------------------------- retriever side
def candidate_logps(encoder: SentenceEncoder, retriever: RetrieverModel, batch: RoundBatch) -> list[torch.Tensor]:
    """log p_phi(. | q) over each search's candidates: softmax(<E_phi(q), e_d> / tau); list of (M,)."""
    if not batch.searches:
        return []
    queries = encoder([s.query for s in batch.searches])  # (S, H)
    out = []
    for query, search in zip(queries, batch.searches, strict=True):
        docs = retriever.doc_vectors(search.candidate_ids, batch.doc_texts)  # (M, H)
        out.append(torch.log_softmax(docs @ query / search.temperature, dim=-1))
    return out


def retrieval_credit(encoder, retriever, batch: RoundBatch) -> torch.Tensor:
    """f's phi-part: -mean A_i log P_phi(D | q, C) by Plackett–Luce over the candidates."""
    pairs = [(lp, s) for lp, s in zip(candidate_logps(encoder, retriever, batch), batch.searches, strict=True)
             if s.behaviour_logprob is not None]  # fmt: skip
    if not pairs:
        return torch.zeros(())
    chosen = torch.stack([plackett_luce_logprob(lp, s.chosen) for lp, s in pairs])
    advantages = torch.stack([batch.advantages[s.trajectory] for _, s in pairs])
    return retrieval_credit_loss(chosen, advantages)


def subset_logps(logps: list[torch.Tensor], batch: RoundBatch) -> torch.Tensor:
    """Renormalised log p over each Q sample's candidate subset; (S_q, M_q)."""
    return torch.stack([torch.log_softmax(logps[q.search][q.candidates], dim=-1) for q in batch.q_samples])


def lower_loss(encoder, retriever, batch: RoundBatch, q_theta: torch.Tensor, cfg: AlgoConfig) -> torch.Tensor:
    """g(phi; theta) on the Q subsample, with Q_theta held fixed."""
    if not batch.q_samples:
        return torch.zeros(())
    log_p = subset_logps(candidate_logps(encoder, retriever, batch), batch)
    deployed = torch.stack(
        [
            torch.log_softmax(
                batch.searches[q.search].deployed_scores[q.candidates] / batch.searches[q.search].temperature, -1
            )
            for q in batch.q_samples
        ]
    )
    return retriever_lower_loss(q_theta.detach(), log_p, deployed, cfg.mu)


def descend(params: list[torch.nn.Parameter], loss_fn: Callable[[], torch.Tensor], steps: int, lr: float) -> float:
    optimizer = torch.optim.Adam(params, lr=lr)
    value = 0.0
    for _ in range(steps):
        optimizer.zero_grad()
        loss = loss_fn()
        if loss.requires_grad:
            loss.backward()
            optimizer.step()
        value = float(loss.detach())
    return value


# ----------------------------------------------------------------------------- policy side
def answer_logprobs(policy: PolicyModel, q: QSample) -> torch.Tensor:
    """log pi_theta(y* | x, d) for one Q sample's candidates; (M_q,), differentiable."""
    return torch.stack([policy.answer_logprob(ctx, q.answer_ids) for ctx in q.context_ids])


def compute_q(policy: PolicyModel, batch: RoundBatch, cfg: AlgoConfig) -> torch.Tensor:
    """Q_theta over each Q sample's candidates, without gradients; (S_q, M_q)."""
    if not batch.q_samples:
        return torch.zeros(0, 0)
    with torch.no_grad():
        return torch.stack([q_target(answer_logprobs(policy, q), cfg.beta_q, prior(q, cfg)) for q in batch.q_samples])


def prior(q: QSample, cfg: AlgoConfig) -> torch.Tensor | None:
    return q.log_prior if cfg.q_prior else None


@dataclass
class Coupling:
    """What the policy step's bilevel correction needs from the retriever step: lambda, the Q subsample on
    which z and phi were fit, and log p_phi, log p_z over it (constants for theta)."""

    lam: float
    q_samples: list[QSample]
    log_p_phi: torch.Tensor  # (S_q, M_q)
    log_p_z: torch.Tensor  # (S_q, M_q)


def policy_step(
    policy: PolicyModel,
    batch: RoundBatch,
    cfg: AlgoConfig,
    *,
    sequence_weights: torch.Tensor | None,
    coupling: Coupling | None,
    optimizer: torch.optim.Optimizer,
) -> dict[str, float]:
    """One step on f's theta-part (+ lambda x the bilevel correction), one sequence at a time for memory."""
    optimizer.zero_grad()
    stats = {"loss/policy": 0.0, "kl/mean": 0.0, "clip_ratio/mean": 0.0}
    records = batch.records
    valid = [i for i, r in enumerate(records) if any(t.generated_ids for t in r.turns)]
    for i in valid:
        record = records[i]
        ids, mask = record.token_ids, record.generated_mask
        start = mask.index(1)
        completion_mask = torch.tensor(mask[start:], dtype=torch.float32)[None]  # (1, T')
        old = torch.zeros_like(completion_mask)
        old[0, completion_mask[0].bool()] = torch.tensor([lp for t in record.turns for lp in t.generated_logprobs])
        logps = policy.token_logps(ids, start)[None]  # (1, T')
        ref = policy.token_logps(ids, start, reference=True)[None] if cfg.beta else None
        weights = None if sequence_weights is None else sequence_weights[i : i + 1]
        loss, st = grpo_loss(
            logps, old, batch.advantages[i : i + 1], completion_mask,
            eps_low=cfg.eps_low, eps_high=cfg.eps_high, beta=cfg.beta, ref_logps=ref, sequence_weights=weights,
        )  # fmt: skip
        (loss / len(valid)).backward()
        for key in stats:
            stats[key] += st[key] / len(valid)
    if coupling is not None and coupling.q_samples:
        lam, samples = coupling.lam, coupling.q_samples
        correction_total = 0.0
        for k, q in enumerate(samples):
            # Chain rule by hand: d(term)/d(answer log-probs) is cheap and exact; then each candidate's
            # sequence is back-propagated alone, so memory stays at one sequence, as for the GRPO term.
            with torch.no_grad():
                answer_lp = answer_logprobs(policy, q)  # (M_q,)
            answer_lp.requires_grad_(True)
            q_theta = q_target(answer_lp, cfg.beta_q, prior(q, cfg))[None]  # (1, M_q)
            term = lam * bilevel_correction(q_theta, coupling.log_p_phi[k : k + 1], coupling.log_p_z[k : k + 1])
            term = term / len(samples)
            (d_term,) = torch.autograd.grad(term, answer_lp)
            for d, context in enumerate(q.context_ids):
                policy.answer_logprob(context, q.answer_ids).backward(d_term[d])
            correction_total += float(term.detach())
        stats["loss/bilevel_correction"] = correction_total
    optimizer.step()
    return stats


def reweight(retriever: RetrieverModel, batch: RoundBatch, cfg: AlgoConfig) -> torch.Tensor:
    """Clipped prod_t P_phi(D_t) / P_phi_old(D_t) per trajectory: logged rollouts seen by the adapted retriever."""
    log_ratio = torch.zeros(len(batch.records))
    with torch.no_grad():
        for lp, search in zip(candidate_logps(retriever.query, retriever, batch), batch.searches, strict=True):
            if search.behaviour_logprob is None:
                continue
            log_ratio[search.trajectory] += plackett_luce_logprob(lp, search.chosen) - search.behaviour_logprob
    return log_ratio.exp().clamp(max=cfg.weight_clip)


def combine(a: torch.Tensor | None, b: torch.Tensor | None) -> torch.Tensor | None:
    if a is None or b is None:
        return a if b is None else b
    return a * b


# ----------------------------------------------------------------------------- the round
def upper_phi_loss(
    phi: SentenceEncoder, retriever: RetrieverModel, batch: RoundBatch, q_theta: torch.Tensor, cfg, lam: float
) -> torch.Tensor:
    """f_phi / lambda + g(phi; theta): the retriever's objective when it adapts to the policy."""
    return retrieval_credit(phi, retriever, batch) / lam + lower_loss(phi, retriever, batch, q_theta, cfg)


def retriever_phase(
    policy: PolicyModel, retriever: RetrieverModel, batch: RoundBatch, cfg: AlgoConfig, lam: float
) -> tuple[dict[str, float], Coupling | None]:
    """Steps 1-2 (retriever FIRST): Q_theta, z on g (bridge), then phi on f_phi / lambda + g. Returns the stats
    (with `time/q_s`) and, for bridge, what the policy step's correction needs."""
    stats: dict[str, float] = {}
    phi = retriever.query
    q_started = time.perf_counter()
    q_theta = compute_q(policy, batch, cfg)
    stats["time/q_s"] = time.perf_counter() - q_started
    z = None
    if cfg.algo == "bridge":
        z = retriever.copy_query()
        stats["loss/lower_z"] = descend(
            list(z.parameters()), lambda: lower_loss(z, retriever, batch, q_theta, cfg),
            cfg.retriever_steps, cfg.retriever_lr,
        )  # fmt: skip
    stats["loss/retriever"] = descend(
        list(phi.parameters()), lambda: upper_phi_loss(phi, retriever, batch, q_theta, cfg, lam),
        cfg.retriever_steps, cfg.retriever_lr,
    )  # fmt: skip
    if z is None or not batch.q_samples:
        return stats, None
    with torch.no_grad():
        log_p_phi = subset_logps(candidate_logps(phi, retriever, batch), batch)
        log_p_z = subset_logps(candidate_logps(z, retriever, batch), batch)
    return stats, Coupling(lam, batch.q_samples, log_p_phi, log_p_z)


def policy_phase(
    policy: PolicyModel, batch: RoundBatch, cfg: AlgoConfig, *, weights: torch.Tensor | None, coupling: Coupling | None
) -> dict[str, float]:
    """Step 3: `policy_steps` steps on theta over `batch`'s rollouts (+ the correction on `coupling`'s samples)."""
    optimizer = torch.optim.Adam(policy.parameters(), lr=cfg.policy_lr)
    stats: dict[str, float] = {}
    for _ in range(cfg.policy_steps):
        stats.update(policy_step(policy, batch, cfg, sequence_weights=weights, coupling=coupling, optimizer=optimizer))
    if weights is not None:
        stats["weights/mean"] = float(weights.mean())
    return stats


def finish(stats: dict[str, float], cfg: AlgoConfig, lam: float, elapsed: float) -> dict[str, float]:
    """Round-level stats: wall time, Q_theta's share of it, lambda and the next round's lambda."""
    q_seconds = stats.pop("time/q_s", 0.0)
    stats["time/round_s"] = elapsed
    stats["time/q_share"] = q_seconds / elapsed if elapsed else 0.0
    stats["lambda"] = lam
    stats["lambda_next"] = min(lam + cfg.lambda_step, cfg.lambda_max) if cfg.algo == "bridge" else lam
    return stats


def train_round(
    policy: PolicyModel, retriever: RetrieverModel, batch: RoundBatch, cfg: AlgoConfig, lam: float
) -> dict[str, float]:
    """The whole round on one batch of logged rollouts (`policy_rollouts="reweighted"`)."""
    torch.manual_seed(cfg.seed)
    started = time.perf_counter()
    stats: dict[str, float] = {}
    phi = retriever.query

    coupling = None
    if cfg.algo in ("bridge", "alt-rp", "retriever-only"):
        phase_stats, coupling = retriever_phase(policy, retriever, batch, cfg, lam)
        stats.update(phase_stats)

    if cfg.algo in ("bridge", "alt-rp", "search-r1"):
        reweighted = cfg.updates_retriever  # the policy step sees the adapted retriever through the ratio
        weights = combine(reweight(retriever, batch, cfg) if reweighted else None, batch.sequence_weights)
        stats.update(policy_phase(policy, batch, cfg, weights=weights, coupling=coupling))

    if cfg.algo == "alt-pr":
        stats.update(policy_phase(policy, batch, cfg, weights=batch.sequence_weights, coupling=None))
        q_started = time.perf_counter()
        q_theta = compute_q(policy, batch, cfg)  # the retriever adapts to the UPDATED policy
        stats["time/q_s"] = time.perf_counter() - q_started
        stats["loss/retriever"] = descend(
            list(phi.parameters()), lambda: upper_phi_loss(phi, retriever, batch, q_theta, cfg, lam),
            cfg.retriever_steps, cfg.retriever_lr,
        )  # fmt: skip

    if cfg.algo == "joint":
        q_started = time.perf_counter()
        q_theta = compute_q(policy, batch, cfg)
        stats["time/q_s"] = time.perf_counter() - q_started
        retriever_optimizer = torch.optim.Adam(list(phi.parameters()), lr=cfg.retriever_lr)
        retriever_optimizer.zero_grad()
        retriever_loss = upper_phi_loss(phi, retriever, batch, q_theta, cfg, lam)
        if retriever_loss.requires_grad:
            retriever_loss.backward()
        stats["loss/retriever"] = float(retriever_loss.detach())
        # theta steps on its own gradients, phi on its own: one simultaneous step on f + g
        policy_optimizer = torch.optim.Adam(policy.parameters(), lr=cfg.policy_lr)
        stats.update(policy_step(policy, batch, cfg, sequence_weights=batch.sequence_weights, coupling=None,
                                 optimizer=policy_optimizer))  # fmt: skip
        retriever_optimizer.step()

    return finish(stats, cfg, lam, time.perf_counter() - started)


# ----------------------------------------------------------------------------- fresh rollouts, in two phases
def train_retriever_phase(
    policy: PolicyModel, retriever: RetrieverModel, batch: RoundBatch, cfg: AlgoConfig, lam: float
) -> tuple[dict[str, float], Coupling | None]:
    """`policy_rollouts="fresh"`, first half: the retriever steps on the round's rollouts; phi is then
    published and rollouts collected again before `train_policy_phase`."""
    torch.manual_seed(cfg.seed)
    started = time.perf_counter()
    stats, coupling = retriever_phase(policy, retriever, batch, cfg, lam)
    stats["time/round_s"] = time.perf_counter() - started
    return stats, coupling


def train_policy_phase(
    policy: PolicyModel,
    fresh: RoundBatch,
    cfg: AlgoConfig,
    lam: float,
    coupling: Coupling | None,
    retriever_stats: dict[str, float],
) -> dict[str, float]:
    """Second half: GRPO on rollouts drawn through the adapted retriever (weights 1: they ARE on phi), the
    correction on the first collection's Q samples where z and phi were fit. Returns the whole round's stats."""
    torch.manual_seed(cfg.seed + 1)
    started = time.perf_counter()
    stats = {**retriever_stats, **policy_phase(policy, fresh, cfg, weights=None, coupling=coupling)}
    return finish(stats, cfg, lam, stats.pop("time/round_s") + time.perf_counter() - started)
