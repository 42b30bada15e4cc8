"""How close the paper's `bridge` estimator (and `drop`) come to the full `two-state` estimator of the policy
gradient, on one real batch, for several gamma; and what the retriever update costs, bridge vs two-state.

The batch: demo hotpotqa questions x G rollouts, each a real SmolLM2 sample after a Plackett–Luce draw of
3 documents from the trainer's retriever, every second rollout answering with the gold answer (so rewards,
exact match, differ within groups; `services/trainer/synthetic.py`).

For each gamma, from the same start: phi <- K steps on f_phi / gamma + g (the penalised state eta_gamma*),
z <- K steps on g alone (eta*), then three theta-gradients at (theta, phi), each the trainer's own
`policy_step` (with a zero learning rate, so theta stays put):
  two-state  grad f + gamma (grad g(phi) - grad g(z))
  bridge     grad f
  drop       grad f + gamma grad g(phi)
and the cosine and relative error ||est - two-state|| / ||two-state|| of bridge and drop. Last, one process
each runs the retriever update alone (`bench.train_round`'s rows) for peak memory and time.

    python -m experiments.estimator_fidelity [--gammas 0.02,0.1,0.5,2] [--questions 6] [--group 4]
"""

from __future__ import annotations

import json
import tempfile
import time
from pathlib import Path

import torch

from bench.script import RESULTS, Models, prepare_models, run_module, script_parser
from services.trainer.algo.batch import RoundBatch, build_batch
from services.trainer.algo.config import AlgoConfig
from services.trainer.algo.optim import RoundOptimizers, TrainOptimizer
from services.trainer.algo.round import (
    Coupling,
    candidate_logps,
    policy_step,
    retriever_phase,
    reweight,
    score_old_retrieval,
    subset_logps,
)
from services.trainer.models import PolicyModel, RetrieverModel
from services.trainer.synthetic import build_rollouts, demo_data

PAPER = {"bridge": (0.998, 0.048), "drop": (0.183, 14.756)}  # gamma = 0.02: cosine, relative error


def theta_gradient(policy: PolicyModel, batch, cfg: AlgoConfig, weights, coupling) -> torch.Tensor:
    """The flattened gradient one `policy_step` would apply (learning rate 0, no clipping: theta stays). With an
    empty batch it is the coupling term's gradient alone (the GRPO part, shared by all three, is taken once)."""
    optimizer = TrainOptimizer(policy.parameters(), lr=0.0)
    policy_step(policy, batch, cfg, sequence_weights=weights, coupling=coupling, optimizer=optimizer)
    return torch.cat([torch.zeros_like(p).flatten() if p.grad is None else p.grad.flatten()
                      for p in policy.parameters()])  # fmt: skip


def no_rollouts(batch: RoundBatch) -> RoundBatch:
    return RoundBatch(records=[], rewards=torch.zeros(0), advantages=torch.zeros(0), searches=batch.searches,
                      q_samples=batch.q_samples, doc_texts=batch.doc_texts)  # fmt: skip


def fidelity(models: Models, records, docs, gamma: float, seed: int) -> dict[str, float]:
    torch.manual_seed(seed)
    policy = PolicyModel(models.policy, None, 8, 16)
    retriever = RetrieverModel(models.retriever, None)
    group = len({r.group_index for r in records})
    cfg = AlgoConfig(algo="bridge", estimator="two-state", gamma=gamma, group_size=group, seed=seed, max_grad_norm=0.0)
    batch = build_batch([r.model_copy(deep=True) for r in records], cfg, policy.tokenizer, docs)
    score_old_retrieval(retriever, batch, cfg.tis_cap)
    stats, coupling = retriever_phase(policy, retriever, batch, cfg, gamma, RoundOptimizers(cfg))
    weights = reweight(retriever, batch, cfg)
    with torch.no_grad():
        log_p_phi = subset_logps(candidate_logps(retriever.query, retriever, batch), batch)
    grad_f = theta_gradient(policy, batch, cfg, weights, None)
    empty = no_rollouts(batch)
    grads = {
        "bridge": grad_f,
        "two-state": grad_f + theta_gradient(policy, empty, cfg, None, coupling),
        "drop": grad_f + theta_gradient(policy, empty, cfg, None, Coupling(gamma, batch.q_samples, log_p_phi)),
    }
    full = grads["two-state"]
    row = {"gamma": gamma, "norm/two-state": float(full.norm()), "q_samples": len(batch.q_samples),
           "rewards/mean": float(batch.rewards.mean())}  # fmt: skip
    for name in ("bridge", "drop"):
        est = grads[name]
        row[f"cosine/{name}"] = float(torch.nn.functional.cosine_similarity(est, full, dim=0))
        row[f"rel_err/{name}"] = float((est - full).norm() / full.norm())
    row["norm/grad_f"] = float(grads["bridge"].norm())
    row["norm/coupling"] = float((full - grads["bridge"]).norm())
    return row


def main() -> None:
    parser = script_parser(__doc__, seed=0, out=RESULTS / "estimator_fidelity.json")
    parser.add_argument("--gammas", default="0.02,0.1,0.5,2")
    parser.add_argument("--questions", type=int, default=6)
    parser.add_argument("--group", type=int, default=4)
    args = parser.parse_args()
    models = prepare_models(args.work)
    started = time.perf_counter()
    items, corpus = demo_data()
    policy = PolicyModel(models.policy, None, 8, 16)
    retriever = RetrieverModel(models.retriever, None)
    records, docs = build_rollouts(policy, retriever, items[: args.questions], corpus, group=args.group,
                                   seed=args.seed, gold_every=2, progress=True)  # fmt: skip
    del policy, retriever
    rows = [fidelity(models, records, docs, float(g), args.seed) for g in args.gammas.split(",")]

    batch_file = Path(tempfile.mkdtemp()) / "batch.json"
    batch_file.write_text(json.dumps({"records": [r.model_dump(mode="json") for r in records], "docs": docs}))
    cost = {}
    for row in ("bridge/retriever", "two-state/retriever"):
        out = run_module("bench.train_round", "--one", row, "--batch", str(batch_file), "--work", str(args.work))
        cost[row] = json.loads(out.strip().splitlines()[-1])
    wall = time.perf_counter() - started

    print(f"\nbatch: {args.questions} questions x G={args.group}, mean reward {rows[0]['rewards/mean']:.2f}, "
          f"{rows[0]['q_samples']} Q samples")  # fmt: skip
    print(f"{'gamma':>7} {'cos bridge':>11} {'relerr bridge':>14} {'cos drop':>9} {'relerr drop':>12} "
          f"{'|grad f|':>9} {'|coupling|':>11}")  # fmt: skip
    for r in rows:
        print(f"{r['gamma']:>7} {r['cosine/bridge']:>11.4f} {r['rel_err/bridge']:>14.4f} {r['cosine/drop']:>9.4f} "
              f"{r['rel_err/drop']:>12.4f} {r['norm/grad_f']:>9.3g} {r['norm/coupling']:>11.3g}")  # fmt: skip
    print(f"paper (gamma 0.02): bridge cosine {PAPER['bridge'][0]}, rel err {PAPER['bridge'][1]}; "
          f"drop cosine {PAPER['drop'][0]}, rel err {PAPER['drop'][1]}")  # fmt: skip
    b, t = cost["bridge/retriever"], cost["two-state/retriever"]
    over_b, over_t = b["peak_mb"] - b["loaded_mb"], t["peak_mb"] - t["loaded_mb"]
    print(f"retriever update: bridge {b['seconds']:.1f} s, {over_b:.0f} MB over load (peak {b['peak_mb']:.0f}); "
          f"two-state {t['seconds']:.1f} s, {over_t:.0f} MB over load (peak {t['peak_mb']:.0f})")  # fmt: skip
    saved_time = 1 - b["seconds"] / t["seconds"]
    print(f"bridge vs two-state: memory over load {1 - over_b / max(over_t, 1):.1%} and time {saved_time:.1%} saved "
          f"(paper: 49.7 % memory, 55.8 % time)")  # fmt: skip
    print(f"wall time {wall:.0f} s")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"rows": rows, "cost": cost, "wall_s": wall, "args": vars(args) | {
        "work": str(args.work), "out": str(args.out)}}, indent=2))  # fmt: skip


if __name__ == "__main__":
    main()
