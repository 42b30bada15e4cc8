"""One training round for every algorithm behind `--algo` (DESIGN §4), reading top to bottom.

bridge:  K steps phi <- phi - eta (grad_phi f / lambda + grad_phi g(phi; theta))   (retriever FIRST)
         theta <- theta - alpha (grad_theta f + the estimator's coupling term)            (then the policy)
           bridge (the paper's): no coupling term;  drop: + lambda grad_theta g(phi; theta);
           two-state: z <- phi, K steps on g(z; theta) first, + lambda (grad_theta g(phi) - grad_theta g(z))
         lambda <- min(lambda + delta, lambda_max)   (or lambda = gamma, fixed)
The others drop or reorder pieces of the same code: search-r1 (theta only), retriever-only (phi only),
alt-rp (phi then theta, no coupling), alt-pr (theta then phi), joint (one simultaneous step on f + g for both).

Before any step the round scores its batch under theta_old and phi_old with the trainer's own models: GRPO's
ratio and the re-weighting ratio divide by those (exactly 1 at no change); the engine's and the retriever
service's behaviour log-probs enter only through truncated importance weights (`tis_cap`), reported per round.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

from services.modeling.encoder import SentenceEncoder
from services.modeling.plackett_luce import plackett_luce_logprob_torch
from services.trainer.algo.batch import QSample, RoundBatch
from services.trainer.algo.config import AlgoConfig
from services.trainer.algo.losses import (
    bilevel_correction,
    grpo_loss,
    q_target,
    rag_theta_term,
    retrieval_credit_loss,
    retriever_lower_loss,
)
from services.trainer.algo.optim import RoundOptimizers, TrainOptimizer
from services.trainer.models import PolicyModel, RetrieverModel


# ----------------------------------------------------------------------------- retriever side
def candidate_logps(encoder: SentenceEncoder, retriever: RetrieverModel, batch: RoundBatch) -> list[torch.Tensor]:
    """log p_phi(. | q) over each search's candidates: softmax(<E_phi(q), e_d> / tau); list of (M,)."""
    if not batch.searches:
        return []
    with retriever.placement.forward():
        queries = encoder([s.query for s in batch.searches]).float()  # (S, H)
    out = []
    for query, search in zip(queries, batch.searches, strict=True):
        docs = retriever.doc_vectors(search.candidate_ids, batch.doc_texts)  # (M, H)
        out.append(torch.log_softmax(docs @ query / search.temperature, dim=-1))
    return out


def retrieval_tis(batch: RoundBatch, cap: float) -> dict[int, float]:
    """min(cap, P_phi_old(D) / P_behaviour(D)) per sampled search (by index): the service's bf16 draw, or an
    older served version's, against the trainer's phi_old. 1 where the old log-prob is not scored."""
    return {
        n: min(cap, math.exp(s.old_logprob - s.behaviour_logprob)) if s.old_logprob is not None else 1.0
        for n, s in enumerate(batch.searches)
        if s.behaviour_logprob is not None
    }


def retrieval_credit(
    encoder, retriever, batch: RoundBatch, cfg: AlgoConfig, stats: dict[str, float] | None = None
) -> torch.Tensor:
    """f's phi-part: the clipped surrogate on P_phi(D | q, C) / P_phi_old(D | q, C) by Plackett–Luce over the
    candidates, times the truncated importance weight of the service's draw; its clip stats go to `stats`."""
    weights = retrieval_tis(batch, cfg.tis_cap)
    if not weights:
        return torch.zeros(())
    logps = candidate_logps(encoder, retriever, batch)
    chosen = torch.stack([plackett_luce_logprob_torch(logps[n], batch.searches[n].chosen) for n in weights])
    old = torch.tensor([batch.searches[n].old_logprob for n in weights], dtype=chosen.dtype)
    advantages = torch.stack([batch.advantages[batch.searches[n].trajectory] for n in weights])
    loss, credit_stats = retrieval_credit_loss(chosen, old, advantages, torch.tensor(list(weights.values())),
                                               eps_low=cfg.retrieval_clip, eps_high=cfg.retrieval_clip)  # fmt: skip
    if stats is not None:
        stats.update(credit_stats)
    return loss


def score_old_retrieval(retriever: RetrieverModel, batch: RoundBatch, cap: float) -> dict[str, float]:
    """Each sampled search's chosen set scored by the trainer under phi_old (before any retriever step)."""
    sampled = [n for n, s in enumerate(batch.searches) if s.behaviour_logprob is not None]
    if not sampled:
        return {}
    with torch.no_grad():
        logps = candidate_logps(retriever.query, retriever, batch)
    for n in sampled:
        batch.searches[n].old_logprob = float(plackett_luce_logprob_torch(logps[n], batch.searches[n].chosen))
    diffs = [abs(batch.searches[n].old_logprob - batch.searches[n].behaviour_logprob) for n in sampled]
    weights = list(retrieval_tis(batch, cap).values())
    return {
        "mismatch/retrieval_abs_mean": sum(diffs) / len(diffs),
        "tis/retrieval_mean": sum(weights) / len(weights),
        "tis/retrieval_clip_frac": sum(w >= cap for w in weights) / len(weights),
    }


def retriever_unchanged_reason(batch: RoundBatch, cfg: AlgoConfig) -> str | None:
    """Why phi cannot move on this batch, or None when it can. Both of phi's terms need sampled searches: the
    credit divides by their behaviour log-prob, and the target's Q samples are drawn from them only (a greedy
    search has no distribution over its candidates); the target also needs a y* for the question. A round with no
    signal takes no retriever step and must not publish a version identical to the one it started from."""
    if not cfg.updates_retriever:
        return None
    if not batch.sampled:
        return "no sampled searches"
    if cfg.retriever_objective == "target" and not batch.q_samples:
        return "no sampled searches with a target answer"
    return None


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


def descend(optimizer: TrainOptimizer, loss_fn: Callable[[], torch.Tensor], steps: int) -> tuple[float, float]:
    """`steps` optimizer steps on `loss_fn`; returns (the last loss, the last gradient norm before clipping)."""
    value, grad_norm = 0.0, 0.0
    for _ in range(steps):
        optimizer.zero_grad()
        loss = loss_fn()
        if loss.requires_grad:
            loss.backward()
            grad_norm = optimizer.step()
        value = float(loss.detach())
    return value, grad_norm


# ----------------------------------------------------------------------------- policy side
def answer_logprobs(policy: PolicyModel, q: QSample) -> torch.Tensor:
    """log pi_theta(y* | x, d) for one Q sample's candidates; (M_q,), differentiable."""
    return policy.answer_logprobs(q.context_ids, q.answer_ids)


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
    """What the policy step's coupling term needs from the retriever step: its weight, the Q subsample on which
    phi (and z) were fit, and log p_phi (and log p_z) over it, constants for theta.

    With `log_p_z` (two-state): lam (grad_theta g(phi) - grad_theta g(z)); without (drop, joint):
    lam grad_theta g(phi; theta)."""

    lam: float
    q_samples: list[QSample]
    log_p_phi: torch.Tensor  # (S_q, M_q)
    log_p_z: torch.Tensor | None = None  # (S_q, M_q)

    def term(self, q_theta: torch.Tensor, k: int) -> torch.Tensor:
        log_p_phi = self.log_p_phi[k : k + 1]
        if self.log_p_z is None:
            return self.lam * rag_theta_term(q_theta, log_p_phi)
        return self.lam * bilevel_correction(q_theta, log_p_phi, self.log_p_z[k : k + 1])


def generation_tis(batch: RoundBatch, i: int, old: torch.Tensor, completion_mask: torch.Tensor, cap: float):
    """min(cap, pi_old / pi_behaviour) per generated token of record i, 1 elsewhere; (T',), plus |log diff|."""
    record = batch.records[i]
    generated = completion_mask.bool()
    behaviour = torch.tensor([lp for t in record.turns for lp in t.generated_logprobs], dtype=old.dtype)
    weights = torch.ones_like(old)
    diff = old[generated] - behaviour
    weights[generated] = diff.exp().clamp(max=cap)
    abs_diff = torch.zeros_like(old)
    abs_diff[generated] = diff.abs()
    return weights, abs_diff


def policy_step(
    policy: PolicyModel,
    batch: RoundBatch,
    cfg: AlgoConfig,
    *,
    sequence_weights: torch.Tensor | None,
    coupling: Coupling | None,
    optimizer: TrainOptimizer,
) -> dict[str, float]:
    """One step on f's theta-part (+ the coupling term), one sequence at a time for memory.

    The first step of a round runs at theta_old, so its own log-probs (detached) become the old log-probs of
    GRPO's ratio for every later step: no extra forward pass, and the ratio is exactly 1 there."""
    optimizer.zero_grad()
    keys = ("loss/policy", "kl/mean", "clip_ratio/mean", "clip_ratio/low_mean", "clip_ratio/high_mean")
    stats = dict.fromkeys(keys, 0.0)
    records = batch.records
    if batch.old_logps is None:
        batch.old_logps, batch.tis_weights = [None] * len(records), [None] * len(records)
    valid = [i for i, r in enumerate(records) if any(t.generated_ids for t in r.turns)]
    tis_sum, tis_clipped, abs_diff_sum, generated_total = 0.0, 0.0, 0.0, 0.0
    for i in valid:
        record = records[i]
        ids, mask = record.token_ids, record.generated_mask
        start = mask.index(1)
        completion_mask = torch.tensor(mask[start:], dtype=torch.float32)  # (T',)
        logps = policy.token_logps(ids, start, temperature=batch.temperature(i))  # (T',)
        if batch.old_logps[i] is None:
            batch.old_logps[i] = logps.detach()
            batch.tis_weights[i], abs_diff = generation_tis(batch, i, batch.old_logps[i], completion_mask, cfg.tis_cap)
            tis_sum += float((batch.tis_weights[i] * completion_mask).sum())
            tis_clipped += float(((batch.tis_weights[i] >= cfg.tis_cap).float() * completion_mask).sum())
            abs_diff_sum += float(abs_diff.sum())
            generated_total += float(completion_mask.sum())
        ref = None
        if cfg.beta:
            ref = policy.token_logps(ids, start, reference=True, temperature=batch.temperature(i))[None]
        weights = None if sequence_weights is None else sequence_weights[i : i + 1]
        loss, st = grpo_loss(
            logps[None], batch.old_logps[i][None], batch.advantages[i : i + 1], completion_mask[None],
            eps_low=cfg.eps_low, eps_high=cfg.eps_high, beta=cfg.beta, ref_logps=ref, sequence_weights=weights,
            tis_weights=batch.tis_weights[i][None],
        )  # fmt: skip
        (loss / len(valid)).backward()
        for key in stats:
            stats[key] += st[key] / len(valid)
    if generated_total:
        stats.update({"tis/mean": tis_sum / generated_total, "tis/clip_frac": tis_clipped / generated_total,
                      "mismatch/logp_abs_mean": abs_diff_sum / generated_total})  # fmt: skip
    if coupling is not None and coupling.q_samples:
        samples = coupling.q_samples
        coupling_total = 0.0
        for k, q in enumerate(samples):
            # Chain rule by hand: d(term)/d(answer log-probs) on a detached copy is cheap and exact; then one
            # backward through the sample's candidates (one padded forward), so the graph held is one Q sample's.
            answer_lp = answer_logprobs(policy, q)  # (M_q,)
            leaf = answer_lp.detach().requires_grad_(True)
            term = coupling.term(q_target(leaf, cfg.beta_q, prior(q, cfg))[None], k) / len(samples)
            (d_term,) = torch.autograd.grad(term, leaf)
            answer_lp.backward(d_term)
            coupling_total += float(term.detach())
        stats["loss/coupling"] = coupling_total
    stats["grad_norm/policy"] = optimizer.step()
    stats["lr/policy"] = optimizer.adam.param_groups[0]["lr"]
    return stats


def reweight(retriever: RetrieverModel, batch: RoundBatch, cfg: AlgoConfig) -> torch.Tensor:
    """Clipped prod_t P_phi(D_t) / P_phi_old(D_t) per trajectory: logged rollouts seen by the adapted retriever.
    Both are the trainer's own scores (`score_old_retrieval`), so the ratio is exactly 1 where phi did not move."""
    log_ratio = torch.zeros(len(batch.records))
    with torch.no_grad():
        for lp, search in zip(candidate_logps(retriever.query, retriever, batch), batch.searches, strict=True):
            if search.old_logprob is None:
                continue
            log_ratio[search.trajectory] += plackett_luce_logprob_torch(lp, search.chosen) - search.old_logprob
    return log_ratio.exp().clamp(max=cfg.weight_clip)


def combine(a: torch.Tensor | None, b: torch.Tensor | None) -> torch.Tensor | None:
    if a is None or b is None:
        return a if b is None else b
    return a * b


# ----------------------------------------------------------------------------- the round
def upper_phi_loss(
    phi: SentenceEncoder, retriever: RetrieverModel, batch: RoundBatch, q_theta: torch.Tensor, cfg, lam: float,
    stats: dict[str, float] | None = None,
) -> torch.Tensor:  # fmt: skip
    """f_phi / lambda + g(phi; theta): the retriever's objective when it adapts to the policy. Each part can be
    switched off (`cfg.retriever_objective`) to train the lower level on the target or the credit alone."""
    loss = torch.zeros(())
    if cfg.retriever_objective in ("both", "credit"):
        loss = loss + retrieval_credit(phi, retriever, batch, cfg, stats) / lam
    if cfg.retriever_objective in ("both", "target"):
        loss = loss + lower_loss(phi, retriever, batch, q_theta, cfg)
    return loss


def timed_q(policy: PolicyModel, batch: RoundBatch, cfg: AlgoConfig, stats: dict[str, float]) -> torch.Tensor:
    """Q_theta, its time added to `time/q_s` (Q_theta's share of the round is reported from it)."""
    started = time.perf_counter()
    q_theta = compute_q(policy, batch, cfg)
    stats["time/q_s"] = stats.get("time/q_s", 0.0) + time.perf_counter() - started
    return q_theta


def retriever_phase(
    policy: PolicyModel, retriever: RetrieverModel, batch: RoundBatch, cfg: AlgoConfig, lam: float,
    optim: RoundOptimizers,
) -> tuple[dict[str, float], Coupling | None]:  # fmt: skip
    """Steps 1-2 (retriever FIRST): Q_theta, z on g (two-state), then phi on f_phi / lambda + g. Returns the stats
    and, for the bridge estimators with a coupling term (drop, two-state), what the policy step needs."""
    stats: dict[str, float] = {}
    phi = retriever.query
    q_theta = timed_q(policy, batch, cfg, stats)
    z = None
    if cfg.uses_z:
        z = retriever.copy_query()
        stats["loss/lower_z"], stats["grad_norm/z"] = descend(
            optim.get("z", retriever.trainable(z)), lambda: lower_loss(z, retriever, batch, q_theta, cfg),
            cfg.retriever_steps,
        )  # fmt: skip
    stats["loss/retriever"], stats["grad_norm/retriever"] = descend(
        optim.get("phi", retriever.trainable(phi)),
        lambda: upper_phi_loss(phi, retriever, batch, q_theta, cfg, lam, stats), cfg.retriever_steps,
    )  # fmt: skip
    if cfg.algo != "bridge" or cfg.estimator == "bridge" or not batch.q_samples:
        return stats, None
    with torch.no_grad():
        log_p_phi = subset_logps(candidate_logps(phi, retriever, batch), batch)
        log_p_z = subset_logps(candidate_logps(z, retriever, batch), batch) if z is not None else None
    return stats, Coupling(lam, batch.q_samples, log_p_phi, log_p_z)


def policy_phase(
    policy: PolicyModel, batch: RoundBatch, cfg: AlgoConfig, *, weights: torch.Tensor | None,
    coupling: Coupling | None, optim: RoundOptimizers,
) -> dict[str, float]:  # fmt: skip
    """Step 3: `policy_steps` steps on theta over `batch`'s rollouts (+ the coupling term on its samples)."""
    optimizer = optim.get("policy", policy.parameters())
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
    stats["lambda_next"] = cfg.next_lambda(lam)
    return stats


Part = Callable[["RoundContext"], None]


@dataclass
class RoundContext:
    """What a round's parts share: the models, the batch, the optimizers, lambda, the coupling the retriever
    part leaves for the policy part, and the stats every part adds to."""

    policy: PolicyModel
    retriever: RetrieverModel
    batch: RoundBatch
    cfg: AlgoConfig
    lam: float
    optim: RoundOptimizers
    stats: dict[str, float]
    coupling: Coupling | None = None


def retriever_first(ctx: RoundContext) -> None:
    """Steps 1-2: the retriever adapts to the current policy (and leaves the estimator's coupling)."""
    phase_stats, ctx.coupling = retriever_phase(ctx.policy, ctx.retriever, ctx.batch, ctx.cfg, ctx.lam, ctx.optim)
    ctx.stats.update(phase_stats)


def policy_on_logged(ctx: RoundContext) -> None:
    """Step 3 on the logged rollouts, re-weighted by how far phi moved when the retriever was trained."""
    weights = reweight(ctx.retriever, ctx.batch, ctx.cfg) if ctx.cfg.updates_retriever else None
    weights = combine(weights, ctx.batch.sequence_weights)
    ctx.stats.update(policy_phase(ctx.policy, ctx.batch, ctx.cfg, weights=weights, coupling=ctx.coupling,
                                  optim=ctx.optim))  # fmt: skip


def retriever_after(ctx: RoundContext) -> None:
    """alt-pr's second half: the retriever adapts to the UPDATED policy."""
    phi = ctx.retriever.query
    q_theta = timed_q(ctx.policy, ctx.batch, ctx.cfg, ctx.stats)
    ctx.stats["loss/retriever"], ctx.stats["grad_norm/retriever"] = descend(
        ctx.optim.get("phi", ctx.retriever.trainable(phi)),
        lambda: upper_phi_loss(phi, ctx.retriever, ctx.batch, q_theta, ctx.cfg, ctx.lam, ctx.stats),
        ctx.cfg.retriever_steps,
    )  # fmt: skip


def simultaneous(ctx: RoundContext) -> None:
    """joint: one simultaneous step on f + g, both gradients at the same (theta, phi), then both steps:
    phi on f_phi + g, theta on grad_theta f + grad_theta g(phi; theta)."""
    policy, retriever, batch, cfg = ctx.policy, ctx.retriever, ctx.batch, ctx.cfg
    phi = retriever.query
    q_theta = timed_q(policy, batch, cfg, ctx.stats)
    phi_optimizer = ctx.optim.get("phi", retriever.trainable(phi))
    phi_optimizer.zero_grad()
    retriever_loss = upper_phi_loss(phi, retriever, batch, q_theta, cfg, 1.0, ctx.stats)
    if retriever_loss.requires_grad:
        retriever_loss.backward()
    ctx.stats["loss/retriever"] = float(retriever_loss.detach())
    coupling = None
    if batch.q_samples:
        with torch.no_grad():
            log_p_phi = subset_logps(candidate_logps(phi, retriever, batch), batch)
        coupling = Coupling(1.0, batch.q_samples, log_p_phi)  # theta's share of g
    ctx.stats.update(policy_step(policy, batch, cfg, sequence_weights=batch.sequence_weights, coupling=coupling,
                                 optimizer=ctx.optim.get("policy", policy.parameters())))  # fmt: skip
    ctx.stats["grad_norm/retriever"] = phi_optimizer.step()


# Each algorithm is its parts, in order (DESIGN §4's baselines behind one switch).
ALGORITHMS: dict[str, tuple[Part, ...]] = {
    "bridge": (retriever_first, policy_on_logged),
    "alt-rp": (retriever_first, policy_on_logged),
    "search-r1": (policy_on_logged,),
    "retriever-only": (retriever_first,),
    "alt-pr": (policy_on_logged, retriever_after),
    "joint": (simultaneous,),
}


def train_round(
    policy: PolicyModel, retriever: RetrieverModel, batch: RoundBatch, cfg: AlgoConfig, lam: float,
    optim: RoundOptimizers | None = None,
) -> dict[str, float]:  # fmt: skip
    """The whole round on one batch of logged rollouts (`policy_rollouts="reweighted"`). `optim` carries the
    optimizers' state from round to round (a new one starts them fresh)."""
    torch.manual_seed(cfg.seed)
    started = time.perf_counter()
    ctx = RoundContext(policy, retriever, batch, cfg, lam, optim or RoundOptimizers(cfg), stats={})
    if cfg.updates_retriever:
        ctx.stats.update(score_old_retrieval(retriever, batch, cfg.tis_cap))
    for part in ALGORITHMS[cfg.algo]:
        part(ctx)
    return finish(ctx.stats, cfg, lam, time.perf_counter() - started)


# ----------------------------------------------------------------------------- fresh rollouts, in two phases
def train_retriever_phase(
    policy: PolicyModel, retriever: RetrieverModel, batch: RoundBatch, cfg: AlgoConfig, lam: float,
    optim: RoundOptimizers | None = None,
) -> tuple[dict[str, float], Coupling | None]:  # fmt: skip
    """`policy_rollouts="fresh"`, first half: the retriever steps on the round's rollouts; phi is then
    published and rollouts collected again before `train_policy_phase`."""
    torch.manual_seed(cfg.seed)
    optim = optim or RoundOptimizers(cfg)
    started = time.perf_counter()
    stats = score_old_retrieval(retriever, batch, cfg.tis_cap)
    phase_stats, coupling = retriever_phase(policy, retriever, batch, cfg, lam, optim)
    stats.update(phase_stats)
    stats["time/round_s"] = time.perf_counter() - started
    return stats, coupling


def train_policy_phase(
    policy: PolicyModel,
    fresh: RoundBatch,
    cfg: AlgoConfig,
    lam: float,
    coupling: Coupling | None,
    retriever_stats: dict[str, float],
    optim: RoundOptimizers | None = None,
) -> dict[str, float]:
    """Second half: GRPO on rollouts drawn through the adapted retriever (weights 1: they ARE on phi), the
    coupling term on the first collection's Q samples where phi (and z) were fit. Returns the round's stats."""
    torch.manual_seed(cfg.seed + 1)
    optim = optim or RoundOptimizers(cfg)
    started = time.perf_counter()
    stats = {**retriever_stats, **policy_phase(policy, fresh, cfg, weights=None, coupling=coupling, optim=optim)}
    return finish(stats, cfg, lam, stats.pop("time/round_s") + time.perf_counter() - started)
