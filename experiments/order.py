"""Order sensitivity: one retriever-then-policy step (alt-rp) against one policy-then-retriever step
(alt-pr), from the same start and the same batch, scored on a held batch; mean and spread over seeds.

Set-up (offline, real models, no services): a one-search agent on the shipped hotpotqa demo set. For each
training question, G rollouts each sample 3 documents from p_phi (Gumbel top-k over 10 candidates,
temperature 0.05), then the policy samples an answer after an `<answer>` prefill; reward = F1 against the
gold answer. Both orders run the trainer's own `train_round` (algos `alt-rp` and `alt-pr`).

Held metric: the expected exact-match reward of a one-document agent, computed exactly instead of by
sampling: R(theta, phi) = mean_q sum_{d in C(q)} p_phi(d | q) * pi_theta(y* | x, d). The printed gain is
R(after) - R(start) for each order, per seed, then mean and standard deviation.

    python -m experiments.order [--seeds 3] [--train-questions 6] [--held-questions 8]
"""

from __future__ import annotations

import copy
import statistics

import numpy as np
import torch

from bench.script import prepare_models, script_parser
from services.common.answers import f1_score
from services.common.schemas.policy import TrajectoryRecord
from services.modeling.prompt import build_prompt, format_information
from services.trainer.algo.batch import build_batch
from services.trainer.algo.config import AlgoConfig
from services.trainer.algo.round import train_round
from services.trainer.models import PolicyModel, RetrieverModel
from services.trainer.synthetic import demo_data, rollout_record, sample_search

TEMPERATURE, CANDIDATES, SHOWN, GROUP = 0.05, 10, 3, 4


def candidates_for(item, corpus, retriever: RetrieverModel) -> tuple[list[str], np.ndarray]:
    ids = item["metadata"]["context_doc_ids"][:CANDIDATES]
    with torch.no_grad():
        q = retriever.query.encode([item["question"]])[0]
    vecs = np.stack([retriever.doc_vectors([i], corpus_texts(corpus))[0].numpy() for i in ids])
    return ids, vecs @ q


def corpus_texts(corpus) -> dict[str, str]:
    return {k: f"{v['title']}\n{v['text']}" for k, v in corpus.items()}


def rollouts(items, corpus, policy: PolicyModel, retriever: RetrieverModel, seed: int) -> list[TrajectoryRecord]:
    tok, rng, records = policy.tokenizer, np.random.default_rng(seed), []
    torch.manual_seed(seed)
    for item in items:
        ids, scores = candidates_for(item, corpus, retriever)
        passages = {i: (corpus[i]["title"], corpus[i]["text"]) for i in ids}
        for g in range(GROUP):
            search = sample_search(tok, item["question"], ids, scores, passages, rng, shown=SHOWN,
                                   temperature=TEMPERATURE, suffix="<answer>")  # fmt: skip
            context = search.prompt_ids + search.observation_ids
            with torch.no_grad():
                out = policy.model.generate(torch.tensor([context]), max_new_tokens=12, do_sample=True, top_k=0,
                                            stop_strings=["</answer>"], tokenizer=tok)  # fmt: skip
            gen_ids = out[0, len(context) :].tolist()
            answer = tok.decode(gen_ids).split("</answer>")[0].strip()
            records.append(rollout_record(
                policy, search, gen_ids, record_id=f"{item['id']}-{g}", item_id=item["id"], group_index=g,
                golden_answers=item["golden_answers"], text=answer, answer=answer,
                reward=f1_score(answer, item["golden_answers"]),
            ))  # fmt: skip
    return records


def held_reward(items, corpus, policy: PolicyModel, retriever: RetrieverModel) -> float:
    """mean_q sum_d p_phi(d|q) pi_theta(y*|x,d): the expected EM of a one-document agent, exactly."""
    tok, values = policy.tokenizer, []
    with torch.no_grad():
        for item in items:
            ids, scores = candidates_for(item, corpus, retriever)
            p = torch.softmax(torch.tensor(scores) / TEMPERATURE, dim=0)
            answer_ids = tok(f" {item['golden_answers'][0]} </answer>", add_special_tokens=False)["input_ids"]
            prompt = build_prompt(tok, item["question"])
            probs = []
            for doc_id in ids:
                doc = corpus[doc_id]
                ctx = prompt + f"<search> {item['question']} </search>"
                ctx += format_information([(doc["title"], doc["text"])]) + "<answer>"
                ctx_ids = tok(ctx, add_special_tokens=False)["input_ids"]
                probs.append(float(policy.answer_logprob(ctx_ids, answer_ids).exp()))
            values.append(float((p * torch.tensor(probs)).sum()))
    return float(np.mean(values))


def main() -> None:
    parser = script_parser(__doc__)
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--train-questions", type=int, default=6)
    parser.add_argument("--held-questions", type=int, default=8)
    args = parser.parse_args()
    models = prepare_models(args.work)
    items, corpus = demo_data()
    held = items[-args.held_questions :]

    torch.manual_seed(0)
    start_policy = PolicyModel(models.policy, None, 8, 16)
    start_retriever = RetrieverModel(models.retriever, None)
    base = held_reward(held, corpus, start_policy, start_retriever)
    print(f"held reward at the start: {base:.5f}")
    gains: dict[str, list[float]] = {"alt-rp": [], "alt-pr": []}
    for seed in range(args.seeds):
        rng = np.random.default_rng(seed)
        train_items = [items[i] for i in rng.choice(len(items) - args.held_questions, args.train_questions,
                                                     replace=False)]  # fmt: skip
        records = rollouts(train_items, corpus, start_policy, start_retriever, seed)
        docs = {c: (corpus[c]["title"], corpus[c]["text"]) for r in records for c in
                (x["id"] for x in r.turns[0].search.candidates)}  # fmt: skip
        mean_reward = float(np.mean([r.reward for r in records]))
        for algo in gains:
            policy, retriever = copy.deepcopy(start_policy), copy.deepcopy(start_retriever)
            cfg = AlgoConfig(algo=algo, group_size=GROUP, seed=seed, policy_lr=1e-3, retriever_lr=1e-4,
                             q_steps=16, q_candidates=5)  # fmt: skip
            batch = build_batch(records, cfg, policy.tokenizer, docs)
            train_round(policy, retriever, batch, cfg, lam=1.0)
            gain = held_reward(held, corpus, policy, retriever) - base
            gains[algo].append(gain)
            print(f"seed {seed}: train reward (F1) {mean_reward:.3f}; {algo} held gain {gain:+.5f}")
    print()
    for algo, values in gains.items():
        spread = statistics.stdev(values) if len(values) > 1 else 0.0
        print(f"{algo}: held reward gain {statistics.mean(values):+.5f} ± {spread:.5f} over {len(values)} seeds")
    diff = [a - b for a, b in zip(gains["alt-rp"], gains["alt-pr"], strict=True)]
    print(
        f"retriever-first minus policy-first: {statistics.mean(diff):+.5f} "
        f"(positive in {sum(d > 0 for d in diff)}/{len(diff)} seeds)"
    )


if __name__ == "__main__":
    main()
