"""Seconds and peak memory of one training round: bridge vs search-r1 vs a second-order baseline.

All three run on the same batch (built once and saved): 4 demo hotpotqa questions x group 2, each
trajectory a real SmolLM2 sample after a sampled retrieval over 20 candidates. Each algorithm runs in a
fresh process so its peak RSS (ru_maxrss) is its own; "over load" subtracts the RSS after loading models.

The second-order baseline is the implicit-function hypergradient:
  d f / d theta = grad_theta f - grad^2_{theta phi} g . [grad^2_{phi phi} g]^-1 grad_phi f,
with the inverse-Hessian-vector product by a 3-term Neumann series of Hessian-vector products (double
backward through the retriever) and the mixed term by a further backward through Q_theta's policy graph.

Targets: bridge at most 1.15x search-r1's peak memory, and below the second-order baseline's.

    python bench/train_round.py
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from services.cli.prepare import prepare_policy_model, prepare_retriever_model  # noqa: E402
from services.common.schemas.policy import SearchStep, TrajectoryRecord, TurnRecord  # noqa: E402
from services.policy.prompt import build_prompt, format_information  # noqa: E402
from services.retriever.sampling import gumbel_top_k, plackett_luce_logprob  # noqa: E402
from services.trainer.algo.batch import build_batch  # noqa: E402
from services.trainer.algo.config import AlgoConfig  # noqa: E402
from services.trainer.algo.losses import retriever_lower_loss  # noqa: E402
from services.trainer.algo.round import (  # noqa: E402
    answer_logprobs,
    candidate_logps,
    descend,
    lower_loss,
    policy_step,
    retrieval_credit,
    subset_logps,
    train_round,
)
from services.trainer.models import PolicyModel, RetrieverModel  # noqa: E402

DEMO = REPO / "services" / "cli" / "demo"


def rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def make_batch_file(models: Path, out: Path, questions: int = 4, group: int = 2) -> None:
    corpus = {row["id"]: row for row in map(json.loads, (DEMO / "hotpotqa_corpus.jsonl").open())}
    items = [json.loads(line) for line in (DEMO / "hotpotqa_questions.jsonl").open()][:questions]
    policy = PolicyModel(models / "SmolLM2-135M-Instruct", None, 8, 16)
    retriever = RetrieverModel(models / "all-MiniLM-L6-v2", None)
    tok, rng, records = policy.tokenizer, np.random.default_rng(0), []
    ids_all = sorted(corpus)
    for n, item in enumerate(items):
        cand = item["metadata"]["context_doc_ids"] + [ids_all[i] for i in rng.choice(len(ids_all), 10, replace=False)]
        vecs = retriever.docs.encode([f"{corpus[c]['title']}\n{corpus[c]['text']}" for c in cand])
        scores = vecs @ retriever.query.encode([item["question"]])[0]
        for g in range(group):
            chosen = gumbel_top_k(scores / 0.05, 3, rng)
            prompt = build_prompt(tok, item["question"])
            prompt_ids = tok(prompt, add_special_tokens=False)["input_ids"]
            obs = f"<search> {item['question']} </search>" + format_information(
                [(corpus[cand[c]]["title"], corpus[cand[c]]["text"]) for c in chosen]
            )
            obs_ids = tok(obs, add_special_tokens=False)["input_ids"]
            torch.manual_seed(n * 10 + g)
            with torch.no_grad():
                sample = policy.model.generate(torch.tensor([prompt_ids + obs_ids]), max_new_tokens=64, do_sample=True)
            gen_ids = sample[0, len(prompt_ids) + len(obs_ids) :].tolist()
            with torch.no_grad():
                behaviour = policy.token_logps(prompt_ids + obs_ids + gen_ids, len(prompt_ids) + len(obs_ids))
            step = SearchStep(turn=0, query=item["question"],
                              candidates=[{"id": c, "score": float(s)} for c, s in zip(cand, scores, strict=True)],
                              chosen_ids=[cand[c] for c in chosen],
                              logprob=plackett_luce_logprob(scores / 0.05, chosen),
                              mode="sample", temperature=0.05, retriever_version="base")  # fmt: skip
            records.append(TrajectoryRecord(
                id=f"{n}-{g}", item_id=item["id"], group_index=g, question=item["question"],
                golden_answers=item["golden_answers"], prompt=prompt, prompt_ids=prompt_ids,
                turns=[
                    TurnRecord(generated_ids=[], generated_logprobs=[], text="", observation_ids=obs_ids, search=step),
                    TurnRecord(generated_ids=gen_ids, generated_logprobs=behaviour.tolist(), text=""),
                ],
                answer=None, policy_version="base", retriever_version="base", reward=float((n + g) % 2),
                created_at=0.0,
            ))  # fmt: skip
    docs = {c: (corpus[c]["title"], corpus[c]["text"]) for r in records for c in
            (x["id"] for x in r.turns[0].search.candidates)}  # fmt: skip
    out.write_text(json.dumps({"records": [r.model_dump(mode="json") for r in records], "docs": docs}))


def second_order_round(policy, retriever, batch, cfg, lam: float) -> None:
    """Implicit-function hypergradient for theta (Neumann inverse-HVP), then the usual phi steps."""
    # The pooler is not used by mean pooling: keep the parameters that carry gradient.
    phi = [p for n, p in retriever.query.named_parameters() if "pooler" not in n]
    all_phi = list(retriever.query.parameters())
    theta = policy.parameters()
    grad_f_phi = torch.autograd.grad(retrieval_credit(retriever.query, retriever, batch) / lam, phi, allow_unused=True)
    grad_f_phi = [torch.zeros_like(p) if g is None else g for g, p in zip(grad_f_phi, phi, strict=True)]
    log_p = subset_logps(candidate_logps(retriever.query, retriever, batch), batch)
    deployed = log_p.detach()
    q_theta = torch.stack([torch.softmax(answer_logprobs(policy, batch.q_samples[i]) / cfg.beta_q, -1)
                           for i in range(len(batch.q_samples))])  # graph through theta  # fmt: skip
    g = retriever_lower_loss(q_theta, log_p, deployed, cfg.mu)
    grad_g_phi = torch.autograd.grad(g, phi, create_graph=True)
    v, term, eta = [t.clone() for t in grad_f_phi], [t.clone() for t in grad_f_phi], 0.1
    for _ in range(3):  # v ≈ H^-1 grad_phi f by (I - eta H)^i terms
        hvp = torch.autograd.grad(grad_g_phi, phi, grad_outputs=term, retain_graph=True)
        term = [t - eta * h for t, h in zip(term, hvp, strict=True)]
        v = [a + b for a, b in zip(v, term, strict=True)]
    dot = sum((gg * vv.detach()).sum() for gg, vv in zip(grad_g_phi, v, strict=True))
    mixed = torch.autograd.grad(dot, theta, allow_unused=True)
    optimizer = torch.optim.Adam(theta, lr=cfg.policy_lr)
    policy_step(policy, batch, cfg, sequence_weights=None, coupling=None, optimizer=optimizer)
    with torch.no_grad():  # the hypergradient's correction, applied as one more step on theta
        for p, m in zip(theta, mixed, strict=True):
            if m is not None:
                p -= cfg.policy_lr * eta * m
    q_fixed = q_theta.detach()
    descend(
        all_phi,
        lambda: (
            retrieval_credit(retriever.query, retriever, batch) / lam
            + lower_loss(retriever.query, retriever, batch, q_fixed, cfg)
        ),
        cfg.retriever_steps,
        cfg.retriever_lr,
    )


def run_one(algo: str, models: Path, batch_file: Path) -> dict:
    torch.manual_seed(0)
    data = json.loads(batch_file.read_text())
    policy = PolicyModel(models / "SmolLM2-135M-Instruct", None, 8, 16)
    retriever = RetrieverModel(models / "all-MiniLM-L6-v2", None)
    records = [TrajectoryRecord.model_validate(r) for r in data["records"]]
    cfg = AlgoConfig(algo="bridge" if algo == "second-order" else algo, group_size=2)
    batch = build_batch(records, cfg, policy.tokenizer, {k: tuple(v) for k, v in data["docs"].items()})
    retriever.doc_vectors(sorted(batch.doc_texts), batch.doc_texts)  # warm the frozen e_d cache
    loaded = rss_mb()
    started = time.perf_counter()
    if algo == "second-order":
        second_order_round(policy, retriever, batch, cfg, 1.0)
    else:
        train_round(policy, retriever, batch, cfg, 1.0)
    return {"algo": algo, "seconds": time.perf_counter() - started, "peak_mb": rss_mb(), "loaded_mb": loaded}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--one", help=argparse.SUPPRESS)
    parser.add_argument("--batch", type=Path, help="Reuse (or create) the batch file here.")
    parser.add_argument("--work", type=Path, default=REPO / ".cache" / "bench")
    args = parser.parse_args()
    models = args.work / "models"
    if args.one:
        print(json.dumps(run_one(args.one, models, args.batch)))
        return
    prepare_retriever_model(models / "all-MiniLM-L6-v2")
    prepare_policy_model(models / "SmolLM2-135M-Instruct")
    batch_file = args.batch or Path(tempfile.mkdtemp()) / "batch.json"
    if not batch_file.exists():
        make_batch_file(models, batch_file)
    results = {}
    for algo in ("search-r1", "bridge", "second-order"):
        out = subprocess.run([sys.executable, __file__, "--one", algo, "--batch", str(batch_file)],
                             capture_output=True, text=True, check=True)  # fmt: skip
        results[algo] = json.loads(out.stdout.strip().splitlines()[-1])
    print(f"\n{'algo':14} {'seconds':>8} {'peak MB':>9} {'over load MB':>13}")
    for algo, r in results.items():
        print(f"{algo:14} {r['seconds']:>8.1f} {r['peak_mb']:>9.0f} {r['peak_mb'] - r['loaded_mb']:>13.0f}")
    b, s, so = results["bridge"], results["search-r1"], results["second-order"]
    print(f"\nbridge / search-r1 peak memory: {b['peak_mb'] / s['peak_mb']:.2f}x (target <= 1.15x)")
    print(f"bridge / second-order peak memory: {b['peak_mb'] / so['peak_mb']:.2f}x (target < 1.0x)")
    print(f"bridge / search-r1 seconds: {b['seconds'] / s['seconds']:.2f}x")


if __name__ == "__main__":
    main()
