"""Does Q_theta point at the evidence? The lower level pulls p_phi towards Q_theta(d) ∝ pi_theta(y* | x, d)^(1/beta_Q);
that only helps retrieval if the policy finds the gold answer likelier after a supporting passage.

Reads a finished run's logged rollouts (every search step's candidates and their deployed scores), scores each
step's top `--candidates` with the base policy exactly as the trainer does (`build_batch` + `compute_q`), and
compares, per step, the probability mass on the question's supporting passages under p_phi (the retriever that
served the step), under Q_theta, and under a uniform choice among the same candidates.

    python -m experiments.q_theta_probe --run-dir <data_dir>/runs/<run_id> --corpus ../shared/data/corpus/hotpotqa.jsonl
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path


def load_docs(corpus: Path, wanted: set[str]) -> dict[str, tuple[str, str]]:
    docs = {}
    with corpus.open() as fh:
        for line in fh:
            row = json.loads(line)
            if str(row["id"]) in wanted:
                docs[str(row["id"])] = (row.get("title", ""), row["text"])
    return docs


def step_stats(p_phi, q_theta, is_gold) -> dict[str, float | bool]:
    """One search step: mass on the supporting candidates under p_phi, Q_theta, the posterior
    p_phi(d) Q_theta(d) / Z (the retriever's belief re-weighted by the policy's, as in EM-style retriever
    training) and a uniform choice, and whether each favourite candidate is a supporting one. Tensors over
    the same candidates."""
    import torch

    is_gold = is_gold.float()
    posterior = torch.softmax(p_phi.log() + q_theta.log(), dim=-1)
    return {
        "p_phi": float((p_phi * is_gold).sum()), "q_theta": float((q_theta * is_gold).sum()),
        "posterior": float((posterior * is_gold).sum()), "uniform": float(is_gold.mean()),
        "top1_phi": bool(is_gold[int(p_phi.argmax())]), "top1_q": bool(is_gold[int(q_theta.argmax())]),
        "top1_posterior": bool(is_gold[int(posterior.argmax())]),
    }  # fmt: skip


def summarize_steps(rows: list[dict]) -> dict[str, float]:
    n = len(rows)
    return {
        "steps_with_support": n,
        **{f"mass_on_support/{k}": sum(r[k] for r in rows) / n for k in ("p_phi", "q_theta", "posterior", "uniform")},
        "top1_supporting/p_phi": sum(r["top1_phi"] for r in rows) / n,
        "top1_supporting/q_theta": sum(r["top1_q"] for r in rows) / n,
        "top1_supporting/posterior": sum(r["top1_posterior"] for r in rows) / n,
        "q_theta_above_p_phi": sum(r["q_theta"] > r["p_phi"] for r in rows) / n,
    }  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--run-dir", type=Path, required=True, help="A run folder (its round-*/rollouts.json).")
    parser.add_argument("--corpus", type=Path, nargs="+", required=True, help="Corpus JSONL files with the passages.")
    parser.add_argument("--candidates", type=int, default=5, help="Top candidates per step to score (as q_candidates).")
    parser.add_argument("--beta-q", type=float, default=1.0)
    parser.add_argument("--out", type=Path, default=None, help="Write the summary JSON here.")
    args = parser.parse_args()

    import torch

    from services.trainer.algo.batch import build_batch
    from services.trainer.algo.config import AlgoConfig
    from services.trainer.algo.round import compute_q
    from services.trainer.models import PolicyModel
    from services.trainer.rollout import load_round_rollouts
    from services.trainer.settings import TrainerSettings

    records, support = [], {}
    for folder in sorted(args.run_dir.glob("round-*")):
        _, rows = load_round_rollouts(folder / "rollouts.json")
        seen = set()
        for record in rows:  # the G rollouts of a question share the first search: score it once
            if record.item_id not in seen:
                seen.add(record.item_id)
                records.append(record)
        for item in json.loads((folder / "items.json").read_text()):
            support[str(item["id"])] = set((item.get("metadata") or {}).get("supporting_doc_ids", []))
    wanted = {str(c["id"]) for r in records for t in r.turns if t.search for c in t.search.candidates}
    docs = {}
    for corpus in args.corpus:
        docs.update(load_docs(corpus, wanted))
    settings = TrainerSettings()
    cfg = AlgoConfig(algo="retriever-only", q_steps=256, q_candidates=args.candidates, beta_q=args.beta_q)
    policy = PolicyModel(settings.base_policy_dir, None, cfg.lora_rank, cfg.lora_alpha)
    batch = build_batch(records, cfg, policy.tokenizer, docs, baseline=0.0)  # one rollout per question: no groups
    q = compute_q(policy, batch, cfg)
    rows = []
    for sample, q_row in zip(batch.q_samples, q, strict=True):
        search = batch.searches[sample.search]
        gold = support.get(batch.records[search.trajectory].item_id or "", set())
        ids = [search.candidate_ids[c] for c in sample.candidates]
        is_gold = torch.tensor([i in gold for i in ids])
        if not is_gold.any():
            continue  # no supporting passage among the scored candidates: nothing to point at
        rows.append(step_stats(sample.log_prior.exp(), q_row, is_gold))  # the serving p_phi, as the trainer has it
    summary = {"run": str(args.run_dir), "steps_scored": len(batch.q_samples), "candidates": args.candidates,
               **summarize_steps(rows)}  # fmt: skip
    print(json.dumps(summary, indent=2))
    if args.out:
        args.out.write_text(json.dumps(summary, indent=2) + "\n")


if __name__ == "__main__":
    main()
