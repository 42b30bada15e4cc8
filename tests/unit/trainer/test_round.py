"""Every algorithm's round on the real tiny models: finite losses, and exactly the right parts move."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from services.common.schemas.policy import TrajectoryRecord
from services.trainer.algo.batch import build_batch
from services.trainer.algo.config import AlgoConfig
from services.trainer.algo.round import train_policy_phase, train_retriever_phase, train_round
from services.trainer.models import PolicyModel, RetrieverModel
from services.trainer.synthetic import rollout_record, sample_search

pytestmark = pytest.mark.slow
DOCS = {
    "d0": ("Paris", "Paris is the capital and largest city of France."),
    "d1": ("Berlin", "Berlin is the capital of Germany."),
    "d2": ("Rome", "Rome is the capital city of Italy."),
    "d3": ("Madrid", "Madrid is the capital of Spain."),
    "d4": ("Lisbon", "Lisbon is the capital of Portugal."),
}
ITEMS = [("q1", "What is the capital of France?", "Paris"), ("q2", "What is the capital of Italy?", "Rome")]


def make_records(policy: PolicyModel, retriever: RetrieverModel) -> list[TrajectoryRecord]:
    """2 questions x G=2 over DOCS, with scripted answers: the first of each group right, the second wrong."""
    tok = policy.tokenizer
    ids = list(DOCS)
    doc_vecs = retriever.docs.encode([f"{t}\n{x}" for t, x in DOCS.values()])
    records = []
    rng = np.random.default_rng(0)
    rewards = [1.0, 0.0, 0.0, 1.0]
    for n, (item_id, question, answer) in enumerate(ITEMS):
        qvec = retriever.query.encode([question])[0]
        scores = doc_vecs @ qvec
        for g in range(2):
            search = sample_search(tok, question, ids, scores, DOCS, rng, shown=2, temperature=0.1)
            gen_ids = tok(f"<answer> {answer if g == 0 else 'Lyon'} </answer>", add_special_tokens=False)["input_ids"]
            records.append(rollout_record(
                policy, search, gen_ids, record_id=f"t{n}{g}", item_id=item_id, group_index=g,
                golden_answers=[answer], text="x", answer=None, reward=rewards[2 * n + g],
            ))  # fmt: skip
    return records


@pytest.fixture(scope="module")
def base_dirs(policy_models_root):
    return policy_models_root / "SmolLM2-135M-Instruct", policy_models_root / "all-MiniLM-L6-v2"


def snapshot(params) -> list[torch.Tensor]:
    return [p.detach().clone() for p in params]


def moved(before, params) -> bool:
    return any(not torch.equal(b, p.detach()) for b, p in zip(before, params, strict=True))


@pytest.mark.parametrize("algo", ["bridge", "search-r1", "retriever-only", "alt-rp", "alt-pr", "joint"])
def test_round_moves_the_right_parts(base_dirs, algo):
    policy_dir, retriever_dir = base_dirs
    torch.manual_seed(0)
    policy = PolicyModel(policy_dir, None, rank=4, alpha=8)
    retriever = RetrieverModel(retriever_dir, None)
    cfg = AlgoConfig(algo=algo, group_size=2, q_steps=2, q_candidates=3, retriever_steps=2, policy_lr=1e-3,
                     retriever_lr=1e-4)  # fmt: skip
    batch = build_batch(make_records(policy, retriever), cfg, policy.tokenizer, DOCS)
    assert len(batch.searches) == 4 and len(batch.q_samples) == (2 if cfg.needs_q else 0)
    before_policy, before_retriever = snapshot(policy.parameters()), snapshot(retriever.query.parameters())
    stats = train_round(policy, retriever, batch, cfg, lam=1.0)
    assert all(math.isfinite(v) for v in stats.values()), stats
    assert moved(before_policy, policy.parameters()) == cfg.updates_policy
    assert moved(before_retriever, list(retriever.query.parameters())) == cfg.updates_retriever
    if algo == "bridge":  # the paper's estimator: no coupling term, no second retriever state
        assert (
            "loss/coupling" not in stats and "loss/lower_z" not in stats and stats["lambda_next"] == 1.0
        )  # gamma held


def test_fresh_round_in_two_halves(base_dirs):
    """The retriever half moves only phi; the policy half steps theta on OTHER rollouts, unweighted, with the
    bilevel correction on the first batch's Q samples (where z and phi were fit)."""
    policy_dir, retriever_dir = base_dirs
    torch.manual_seed(0)
    policy = PolicyModel(policy_dir, None, rank=4, alpha=8)
    retriever = RetrieverModel(retriever_dir, None)
    # gamma=None: the two-state estimator on the lambda schedule (1 -> 1 + lambda_step), the one that grows
    cfg = AlgoConfig(algo="bridge", estimator="two-state", policy_rollouts="fresh", group_size=2, q_steps=2,
                     q_candidates=3, retriever_steps=2, policy_lr=1e-3, retriever_lr=1e-4, gamma=None)  # fmt: skip
    first = build_batch(make_records(policy, retriever), cfg, policy.tokenizer, DOCS)
    before_policy, before_retriever = snapshot(policy.parameters()), snapshot(retriever.query.parameters())
    retriever_stats, coupling = train_retriever_phase(policy, retriever, first, cfg, lam=2.0)
    assert not moved(before_policy, policy.parameters())
    assert moved(before_retriever, list(retriever.query.parameters()))
    assert coupling is not None and coupling.q_samples is first.q_samples and coupling.lam == 2.0
    assert coupling.log_p_phi.shape == coupling.log_p_z.shape == (2, 3)
    assert not torch.allclose(coupling.log_p_phi, coupling.log_p_z)  # phi saw f, z did not

    fresh_records = make_records(policy, retriever)
    for r in fresh_records:
        r.id = "fresh-" + r.id
    fresh = build_batch(fresh_records, cfg, policy.tokenizer, {}, with_q=False)
    assert fresh.q_samples == [] and fresh.sequence_weights is None
    stats = train_policy_phase(policy, fresh, cfg, 2.0, coupling, retriever_stats)
    assert moved(before_policy, policy.parameters())
    assert all(math.isfinite(v) for v in stats.values()), stats
    assert "weights/mean" not in stats  # fresh rollouts are on the adapted retriever: no re-weighting
    assert stats["loss/coupling"] != 0.0 and stats["loss/retriever"] == retriever_stats["loss/retriever"]
    assert stats["lambda"] == 2.0 and stats["lambda_next"] == 2.5
    assert stats["time/round_s"] >= retriever_stats["time/round_s"] and 0 < stats["time/q_share"] < 1
