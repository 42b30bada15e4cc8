"""The round's numerics on the real tiny models: ratios exactly 1 at no change, the behaviour log-probs entering
once through truncated weights, the optimizers' state across rounds, the Q subsample, joint and the estimators."""

from __future__ import annotations

import math

import pytest
import torch

from services.common.schemas.policy import SearchStep, TrajectoryRecord
from services.trainer.algo.batch import SearchSample, build_batch, spread_subsample
from services.trainer.algo.config import AlgoConfig
from services.trainer.algo.optim import RoundOptimizers
from services.trainer.algo.round import (
    candidate_logps,
    policy_step,
    reweight,
    score_old_retrieval,
    subset_logps,
    train_round,
)
from services.trainer.models import RETRIEVER_LORA_FILE, PolicyModel, RetrieverModel
from tests.unit.trainer.test_round import DOCS, make_records, moved, snapshot

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def dirs(policy_models_root):
    return policy_models_root / "SmolLM2-135M-Instruct", policy_models_root / "all-MiniLM-L6-v2"


def models(dirs, **retriever_kwargs):
    torch.manual_seed(0)
    return PolicyModel(dirs[0], None, rank=4, alpha=8), RetrieverModel(dirs[1], None, **retriever_kwargs)


def config(**kw) -> AlgoConfig:
    # beta 0: no reference forward (nothing here is about the KL term), so each round costs less
    base = dict(group_size=2, q_steps=2, q_candidates=3, retriever_steps=2, policy_lr=1e-3, retriever_lr=1e-4, beta=0.0)
    return AlgoConfig(**{**base, **kw})


def test_retrieval_ratio_is_one_at_no_change_and_z_equals_phi(dirs):
    """Evaluations run without dropout, and the ratio's denominator is the trainer's own phi_old score."""
    policy, retriever = models(dirs)
    cfg = config(algo="bridge")
    batch = build_batch(make_records(policy, retriever), cfg, policy.tokenizer, DOCS)
    for search in batch.searches:  # the service's bf16 log-prob differs from the trainer's fp32 one
        search.behaviour_logprob += 0.05
    score_old_retrieval(retriever, batch, cfg.tis_cap)
    assert torch.allclose(reweight(retriever, batch, cfg), torch.ones(len(batch.records)), atol=1e-5)
    z = retriever.copy_query()
    log_p_phi = subset_logps(candidate_logps(retriever.query, retriever, batch), batch)
    log_p_z = subset_logps(candidate_logps(z, retriever, batch), batch)
    assert torch.allclose(log_p_phi - log_p_z, torch.zeros_like(log_p_phi), atol=1e-6)


def test_grpo_ratio_is_one_at_the_first_step_and_the_engine_enters_through_tis(dirs):
    policy, retriever = models(dirs)
    cfg = config(algo="search-r1", beta=0.0, tis_cap=2.0)
    records = make_records(policy, retriever)
    shift = torch.tensor([0.3, -0.3])  # an engine 0.3 nats off, both ways (bf16 vs fp32 measured up to 0.24)
    for record in records:
        turn = record.turns[-1]
        turn.generated_logprobs = [lp + float(shift[n % 2]) for n, lp in enumerate(turn.generated_logprobs)]
    batch = build_batch(records, cfg, policy.tokenizer, DOCS)
    stats = policy_step(policy, batch, cfg, sequence_weights=None, coupling=None,
                        optimizer=RoundOptimizers(cfg).get("policy", policy.parameters()))  # fmt: skip
    assert stats["clip_ratio/mean"] == 0.0  # against the engine's log-probs, half the tokens would sit outside
    assert stats["mismatch/logp_abs_mean"] == pytest.approx(0.3, abs=1e-4)
    assert stats["tis/mean"] == pytest.approx((math.exp(0.3) + math.exp(-0.3)) / 2, rel=0.05)
    record = batch.records[0]
    start = record.generated_mask.index(1)
    with torch.no_grad():  # the trainer's own log-probs (the policy has stepped since, so compare the first turn's)
        fresh = PolicyModel(dirs[0], None, rank=4, alpha=8).token_logps(record.token_ids, start)
    assert torch.allclose(batch.old_logps[0], fresh, atol=1e-5)


def test_live_weight_applied_once_on_a_hand_made_batch(dirs):
    """Live trajectories (baseline advantages A = r) from an engine exactly log(1.5) below the trainer on every
    token: the per-token weight is 1.5 and the ratio 1, so loss/policy = -mean_i A_i * 1.5."""
    policy, retriever = models(dirs)
    cfg = config(algo="search-r1", beta=0.0)
    records = make_records(policy, retriever)
    for record in records:
        turn = record.turns[-1]
        turn.generated_logprobs = [lp - math.log(1.5) for lp in turn.generated_logprobs]
    batch = build_batch(records, cfg, policy.tokenizer, DOCS, baseline=0.0)
    rewards = batch.rewards.tolist()
    stats = train_round(policy, retriever, batch, cfg, lam=1.0)
    assert stats["loss/policy"] == pytest.approx(-sum(r * 1.5 for r in rewards) / len(rewards), rel=1e-4)
    assert batch.sequence_weights is None


def test_decoding_temperature_is_read_from_each_trajectory(dirs):
    policy, retriever = models(dirs)
    cfg = config(algo="search-r1", beta=0.0)
    records = make_records(policy, retriever)
    for record in records:
        record.sampling["temperature"] = 0.5
    batch = build_batch(records, cfg, policy.tokenizer, DOCS)
    record = batch.records[1]
    start = record.generated_mask.index(1)
    with torch.no_grad():
        at_half = policy.token_logps(record.token_ids, start, temperature=0.5)
    policy_step(policy, batch, cfg, sequence_weights=None, coupling=None,
                optimizer=RoundOptimizers(cfg).get("policy", policy.parameters()))  # fmt: skip
    assert torch.allclose(batch.old_logps[1], at_half, atol=1e-5)


# The bridge variant (phi and z optimizers too) runs four rounds of the whole algorithm: `make test-all` only.
@pytest.mark.parametrize("algo", ["search-r1", pytest.param("bridge", marks=pytest.mark.heavy)])
def test_two_rounds_equal_one_process_with_one_optimizer(dirs, tmp_path, algo):
    """Round 1, save the adapter, query tower and optimizer state, reload all in new models, round 2 ==
    the same two rounds in one process with one set of optimizers."""
    cfg = config(algo=algo, estimator="two-state", warmup_ratio=0.5)
    policy, retriever = models(dirs)
    batches = [make_records(policy, retriever), make_records(policy, retriever)]
    for r in batches[1]:
        r.id, r.reward = "b-" + r.id, 1.0 - (r.reward or 0.0)

    def batch(records, p):
        return build_batch([r.model_copy(deep=True) for r in records], cfg, p.tokenizer, DOCS)

    one = RoundOptimizers(cfg, rounds=2)
    for records in batches:
        train_round(policy, retriever, batch(records, policy), cfg, 1.0, one)

    p2, r2 = models(dirs)
    first = RoundOptimizers(cfg, rounds=2)
    train_round(p2, r2, batch(batches[0], p2), cfg, 1.0, first)
    first.save(tmp_path / "optimizer")
    p2.save_adapter(tmp_path / "adapter")
    r2.query.save_weights(tmp_path / "query_encoder.safetensors")
    p3 = PolicyModel(dirs[0], tmp_path / "adapter", rank=4, alpha=8)
    r3 = RetrieverModel(dirs[1], tmp_path / "query_encoder.safetensors")
    resumed = RoundOptimizers(cfg, rounds=2, resume_from=tmp_path / "optimizer")
    train_round(p3, r3, batch(batches[1], p3), cfg, 1.0, resumed)
    assert resumed.get("policy", p3.parameters()).steps == 2
    for a, b in zip(policy.parameters(), p3.parameters(), strict=True):
        assert torch.allclose(a, b, atol=1e-6)
    for a, b in zip(retriever.query.parameters(), r3.query.parameters(), strict=True):
        assert torch.allclose(a, b, atol=1e-6)


def test_q_subsample_takes_distinct_searches_over_questions():
    """G rollouts of a question share the scaffold's search; each (query, candidates) counts once and the
    subsample spreads over the questions."""

    def record(item: str) -> TrajectoryRecord:
        return TrajectoryRecord(id=item, item_id=item, question=item, golden_answers=["a"], prompt="",
                                prompt_ids=[], turns=[], answer=None, policy_version="b", retriever_version="b",
                                created_at=0)  # fmt: skip

    records = [record("q1"), record("q1"), record("q2"), record("q2")]

    def search(trajectory: int, query: str) -> SearchSample:
        return SearchSample(trajectory, query, ["d0", "d1"], torch.zeros(2), torch.tensor([0]), 1.0, 0.0)

    # q1 rollouts: the shared scaffold search, then one own search each; q2: the shared one only.
    searches = [search(0, "q1"), search(0, "q1 own a"), search(1, "q1"), search(1, "q1 own b"),
                search(2, "q2"), search(3, "q2")]  # fmt: skip
    picked = spread_subsample(records, searches, q_steps=3, seed=0)
    keys = [(searches[s].query, tuple(searches[s].candidate_ids)) for s in picked]
    assert len(set(keys)) == 3
    assert {records[searches[s].trajectory].item_id for s in picked} == {"q1", "q2"}
    assert spread_subsample(records, searches, q_steps=3, seed=0) == picked  # seeded
    assert len(spread_subsample(records, searches, q_steps=10, seed=1)) == 4  # only 4 distinct exist


def test_joint_steps_theta_on_f_plus_g(dirs):
    """With every reward equal (A = 0) and no KL, f gives theta no gradient: search-r1 leaves it, joint moves it
    by grad_theta g(phi; theta)."""
    for algo, should_move in (("search-r1", False), ("joint", True)):
        policy, retriever = models(dirs)
        cfg = config(algo=algo, beta=0.0)
        records = make_records(policy, retriever)
        for r in records:
            r.reward = 1.0
        batch = build_batch(records, cfg, policy.tokenizer, DOCS)
        before = snapshot(policy.parameters())
        stats = train_round(policy, retriever, batch, cfg, lam=1.0)
        assert moved(before, policy.parameters()) == should_move, (algo, stats)


@pytest.mark.parametrize(
    ("estimator", "has_z", "has_coupling"), [("bridge", False, False), ("drop", False, True), ("two-state", True, True)]
)
def test_estimators(dirs, estimator, has_z, has_coupling):
    policy, retriever = models(dirs)
    cfg = config(algo="bridge", estimator=estimator)
    batch = build_batch(make_records(policy, retriever), cfg, policy.tokenizer, DOCS)
    optim = RoundOptimizers(cfg)
    stats = train_round(policy, retriever, batch, cfg, lam=1.0, optim=optim)
    assert ("loss/lower_z" in stats) == has_z and ("z" in optim.built) == has_z
    assert ("loss/coupling" in stats) == has_coupling
    assert all(math.isfinite(v) for v in stats.values()), stats


def test_the_default_is_the_papers_fixed_gamma_and_bridge_refuses_an_unmeasured_schedule():
    cfg = AlgoConfig()
    assert (cfg.algo, cfg.estimator, cfg.gamma) == ("bridge", "bridge", 0.02)
    assert cfg.initial_lambda == 0.02 and cfg.next_lambda(0.02) == 0.02
    for estimator in ("bridge", "drop"):
        with pytest.raises(ValueError, match="fixed gamma"):
            AlgoConfig(gamma=None, estimator=estimator)
    assert AlgoConfig(gamma=None, estimator="two-state").next_lambda(1.0) == 1.5  # the schedule, where it is exact
    assert AlgoConfig(algo="alt-rp", gamma=None).next_lambda(1.0) == 1.0


def test_retriever_lora_trains_only_the_adapter_and_saves_a_merged_tower(dirs, tmp_path):
    policy, retriever = models(dirs, params="lora", lora_rank=4, lora_alpha=8)
    frozen = {n: p.detach().clone() for n, p in retriever.query.named_parameters() if "lora_" not in n}
    cfg = config(algo="retriever-only", retriever_params="lora", retriever_lr=1e-2)
    batch = build_batch(make_records(policy, retriever), cfg, policy.tokenizer, DOCS)
    trainable = retriever.trainable(retriever.query)
    assert trainable and all(any(id(p) == id(q) for n, q in retriever.query.named_parameters() if "lora_" in n)
                             for p in trainable)  # fmt: skip
    before = snapshot(trainable)
    train_round(policy, retriever, batch, cfg, lam=1.0)
    assert moved(before, trainable)
    assert all(torch.equal(frozen[n], p.detach()) for n, p in retriever.query.named_parameters() if n in frozen)
    # The service loads the merged tower as a plain query-encoder checkpoint: same vectors as the LoRA model.
    from services.modeling.encoder import SentenceEncoder

    retriever.save_query(tmp_path, "query_encoder.safetensors")
    merged = SentenceEncoder.from_pretrained(dirs[1])
    merged.load_weights(tmp_path / "query_encoder.safetensors")
    texts = ["What is the capital of France?"]
    assert torch.allclose(torch.from_numpy(merged.encode(texts)), torch.from_numpy(retriever.query.encode(texts)),
                          atol=1e-5)  # fmt: skip
    # ... and the trainer continues from the adapter, not from the merged weights
    again = RetrieverModel(dirs[1], tmp_path / "query_encoder.safetensors", params="lora", lora_rank=4, lora_alpha=8)
    assert torch.allclose(torch.from_numpy(again.query.encode(texts)), torch.from_numpy(retriever.query.encode(texts)),
                          atol=1e-5)  # fmt: skip
    # To resume a run, the adapter alone is enough: nothing else is written, and it loads the same tower.
    only = tmp_path / "adapter-only"
    only.mkdir()
    written = retriever.save_trained(only, "query_encoder.safetensors")
    assert [p.name for p in only.iterdir()] == [RETRIEVER_LORA_FILE] and written.stat().st_size < 1_000_000
    resumed = RetrieverModel(dirs[1], only / "query_encoder.safetensors", params="lora", lora_rank=4, lora_alpha=8)
    assert torch.allclose(torch.from_numpy(resumed.query.encode(texts)),
                          torch.from_numpy(retriever.query.encode(texts)), atol=1e-5)  # fmt: skip


def test_search_step_records_what_the_trainer_reads():
    step = SearchStep(turn=0, query="q", candidates=[{"id": "d0", "score": 0.5}], chosen_ids=["d0"], logprob=0.0,
                      mode="sample", temperature=0.1, retriever_version="v")  # fmt: skip
    assert step.temperature == 0.1 and len(step.candidates) == 1


def test_batched_answer_logprobs_match_per_sequence(dirs):
    """Q_theta's candidates in one right-padded forward: the same log-probs and gradients as one at a time."""
    policy, _ = models(dirs)
    with torch.no_grad():  # a non-zero LoRA B, so the adapter's gradients are not trivially zero
        for name, p in policy.model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.01)
    tok = policy.tokenizer
    contexts = [tok(f"Question {i}: " + "word " * (3 + 7 * i), add_special_tokens=False)["input_ids"] for i in range(3)]
    answer = tok("Paris </answer>", add_special_tokens=False)["input_ids"]
    batched = policy.answer_logprobs(contexts, answer)
    single = torch.stack([policy.answer_logprob(c, answer) for c in contexts])
    assert torch.allclose(batched, single, atol=1e-4)
    weights = torch.tensor([0.3, -1.0, 2.0])
    grads = []
    for value in (batched, single):
        policy.model.zero_grad()
        (value * weights).sum().backward()
        grads.append(torch.cat([p.grad.flatten() for p in policy.parameters()]))
    assert torch.allclose(grads[0], grads[1], atol=1e-4, rtol=1e-3)


def test_q_theta_scores_the_tokens_the_policy_writes(dirs):
    """x + d and y* are tokenized as one string: ids(context + answer) == context_ids + answer_ids, and y* is
    what a warm-started policy writes after `<answer>` (`ĠParis`, not `Ġ` + `Paris`)."""
    policy, retriever = models(dirs)
    tok = policy.tokenizer
    batch = build_batch(make_records(policy, retriever), config(algo="bridge"), tok, DOCS)
    assert batch.q_samples
    for q in batch.q_samples:
        record = batch.records[batch.searches[q.search].trajectory]
        answer = f" {record.golden_answers[0]} </answer>"
        for context_ids in q.context_ids:
            whole = tok(tok.decode(context_ids) + answer, add_special_tokens=False)["input_ids"]
            assert whole == context_ids + q.answer_ids
        written = tok(f"<answer> {record.golden_answers[0]} </answer>", add_special_tokens=False)["input_ids"]
        assert written[-len(q.answer_ids) :] == q.answer_ids


def test_greedy_searches_stay_out_of_q_and_g(dirs):
    """A served (greedy) search has no sampling distribution over its candidates: no Q sample, no credit row."""
    policy, retriever = models(dirs)
    records = make_records(policy, retriever)
    for record in records[:2]:  # the first question's group served greedily
        step = record.turns[0].search
        step.mode, step.logprob, step.temperature = "greedy", None, 1.0
    batch = build_batch(records, config(algo="bridge", q_steps=8), policy.tokenizer, DOCS)
    greedy = {n for n, s in enumerate(batch.searches) if s.behaviour_logprob is None}
    assert len(greedy) == 2 and batch.q_samples
    assert not greedy & {q.search for q in batch.q_samples}
