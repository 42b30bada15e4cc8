"""The lower level alone: with the warm-started policy frozen, does the retriever learn from the agent?

Each arm starts from the same query tower and sees the same training questions in the same order, a batch at a
time, through the trainer's own round code (`build_batch` + `train_round`, algo `retriever-only`):

- `target`: g alone, KL(Q_theta || p_phi), Q_theta(d) ∝ pi_theta(y* | x, d)^(1/beta_Q) over the search's top
  candidates (the LM-supervised, REPLUG-style part); needs no generation;
- `credit`: the retrieval credit alone, the clipped ratio on P_phi(D) / P_phi_old(D) times the GRPO advantage of
  G rollouts per question (each samples its shown passages from p_phi and lets the frozen policy answer);
- `both`: the paper's lower level, f_phi / gamma + g;
- `supervised`: the upper bound a user with labels has: the same tower trained contrastively (InfoNCE over the
  question's top candidates) on the same questions' gold supporting passages, the same steps and step size.

The rollouts follow the warm start's protocol: its first search is the question (`search_query`), the shown
passages are sampled from p_phi over M candidates, and the policy then answers (the warm start searches a
second time on under 1 % of questions, so one search is what it does). Every index is an exact scan over the
frozen document vectors of all corpora (what the served collection holds).

Evaluation, before and after every arm, on the evaluation split (first 100 questions) of every dataset that names
supporting passages: recall@3 and @10 of those passages and answer-bearing recall@3 (a top-3 passage writes a gold
alias), each with the question as the query and (suffix `/policy`) with the frozen policy's own first query, with
paired sign tests per question against the start.
Writes results.json, results.md, recall.png and each arm's query tower (safetensors) under --out; resumable.

    python -m experiments.lower_level --qa-dir ../shared/data/qa --corpus-dir ../shared/data/corpus \
        --train-datasets 2wikimultihopqa,hotpotqa --questions 256 --arms supervised,target,credit,both
"""

from __future__ import annotations

import argparse
import json
import random
import time
from pathlib import Path

import numpy as np
import torch
from tqdm import tqdm

from bench.script import REPO, prepare_models
from services.common.answers import contains_gold, exact_match, extract_answer, label_answer
from services.common.schemas.policy import TrajectoryRecord, TurnRecord
from services.data.split import EVAL_SPLIT, training_rows
from services.eval.scoring import support_recall
from services.eval.stats import sign_test
from services.modeling.prompt import ANSWER_STOP, SEARCH_STOP, build_prompt, parse_search
from services.trainer.algo.batch import build_batch
from services.trainer.algo.config import AlgoConfig
from services.trainer.algo.optim import RoundOptimizers
from services.trainer.algo.round import train_round
from services.trainer.models import PolicyModel, RetrieverModel
from services.trainer.synthetic import sample_search
from services.trainer.warmstart.examples import search_query

ARMS = ("supervised", "target", "credit", "both")
KS = (3, 10)
METRICS = ("recall@3", "recall@10", "answer@3")
POLICY = "/policy"  # the suffix of a metric measured with the policy's own first query


# ----------------------------------------------------------------------------- data
def load_corpora(corpus_dir: Path) -> dict[str, tuple[str, str]]:
    docs: dict[str, tuple[str, str]] = {}
    for path in sorted(corpus_dir.glob("*.jsonl")):
        with path.open() as fh:
            for line in fh:
                row = json.loads(line)
                docs[str(row["id"])] = (row.get("title", ""), row["text"])
    return docs


def doc_matrix(encoder_dir: Path, docs: dict[str, tuple[str, str]], cache: Path) -> torch.Tensor:
    """Frozen e_d of every passage, (N, H), in `docs` order, encoded in the precision the retriever service serves
    in (`dtype=auto`: bf16 where the CPU has it natively); cached (the document tower never trains)."""
    from services.common.hardware import resolve_dtype
    from services.modeling.encoder import SentenceEncoder

    if cache.exists():
        saved = torch.load(cache)
        if saved["ids"] == list(docs):
            return saved["vectors"]
    encoder = SentenceEncoder.from_pretrained(encoder_dir, max_length=256, dtype=resolve_dtype("auto"))
    texts = [f"{t}\n{x}" if t else x for t, x in docs.values()]
    chunks = [texts[i : i + 512] for i in range(0, len(texts), 512)]
    vectors = torch.from_numpy(np.concatenate(
        [encoder.encode(chunk, batch_size=16, kind="passage") for chunk in tqdm(chunks, desc="passages")]
    )).float()  # fmt: skip
    cache.parent.mkdir(parents=True, exist_ok=True)
    torch.save({"ids": list(docs), "vectors": vectors}, cache)
    return vectors


def supporting(row: dict) -> list[str]:
    return list((row.get("metadata") or {}).get("supporting_doc_ids") or [])


def eval_rows(qa_dir: Path) -> dict[str, list[dict]]:
    """The evaluation split of every dataset that names supporting passages."""
    out = {}
    for path in sorted(qa_dir.glob("*.jsonl")):
        rows = [json.loads(line) for line in path.read_text().splitlines()[:EVAL_SPLIT] if line.strip()]
        rows = [r for r in rows if supporting(r)]
        if rows:
            out[path.stem] = rows
    return out


def train_questions(
    qa_dir: Path, datasets: list[str], count: int, seed: int, exclude: dict[str, set[str]] | None = None
) -> list[dict]:
    """`count` training-pool questions with supporting passages, the datasets interleaved, in a seeded order;
    none whose id `exclude` lists under its dataset (the questions an adapter trained on)."""
    pools = []
    exclude = exclude or {}
    for dataset in datasets:
        skip = exclude.get(dataset, set())
        rows = [row for _, row in training_rows(qa_dir, dataset) if supporting(row) and row["id"] not in skip]
        random.Random(seed).shuffle(rows)
        pools.append(rows)
    mixed = [row for group in zip(*pools, strict=False) for row in group]
    leftovers = [row for pool in pools for row in pool[min(map(len, pools)) :]]
    return (mixed + leftovers)[:count]


# ----------------------------------------------------------------------------- retrieval
def top_candidates(retriever: RetrieverModel, doc_vecs: torch.Tensor, queries: list[str], m: int):
    with torch.no_grad():
        q = torch.from_numpy(retriever.query.encode(queries, kind="query"))  # (B, H)
        return torch.topk(q @ doc_vecs.T, m, dim=-1)  # (B, M) scores and indices


def recall(retriever: RetrieverModel, doc_vecs: torch.Tensor, ids: list[str], docs, rows: list[dict],
           queries: list[str] | None = None, suffix: str = "") -> dict[str, list]:  # fmt: skip
    """Per question, by exact search with `queries` (default: the question, `search_query`): recall@k of its
    supporting passages among the top k (k in KS), and answer-bearing recall@3 (the top 3 hold a passage that writes
    a gold alias, normalised; None for a yes/no label, which no passage writes)."""
    queries = queries or [search_query(r["question"]) for r in rows]
    _, index = top_candidates(retriever, doc_vecs, queries, max(KS))
    out: dict[str, list] = {f"{m}{suffix}": [] for m in METRICS}
    for row, found in zip(rows, index.tolist(), strict=True):
        for k in KS:
            out[f"recall@{k}{suffix}"].append(support_recall([ids[i] for i in found[:k]], supporting(row)))
        golden = row["golden_answers"]
        holds = any(contains_gold(golden, " ".join(docs[ids[i]])) for i in found[:3])
        out[f"answer@3{suffix}"].append(None if label_answer(golden) else float(holds))
    return out


def evaluate(retriever, doc_vecs, ids, docs, evals: dict[str, list[dict]],
             policy_queries: dict[str, list[str]] | None = None) -> dict[str, dict[str, list]]:  # fmt: skip
    """`recall` per dataset with the question as the query, and (suffix `/policy`) with the policy's own first
    query where `policy_queries` holds them."""
    out = {}
    for dataset, rows in evals.items():
        out[dataset] = recall(retriever, doc_vecs, ids, docs, rows)
        if policy_queries and dataset in policy_queries:
            out[dataset] |= recall(retriever, doc_vecs, ids, docs, rows, policy_queries[dataset], POLICY)
    return out


def mean(values: list) -> float:
    kept = [v for v in values if v is not None]
    return float(np.mean(kept)) if kept else float("nan")


def policy_first_queries(policy: PolicyModel, evals: dict[str, list[dict]], cache: Path, batch: int = 16):
    """The frozen policy's own first search on each evaluation question (greedy, as served): the query of its first
    turn when that turn ends on </search>, else the question (`search_query`, as the retriever then gets no
    search). Cached in `cache`; returns ({dataset: queries}, {dataset: share of questions it searched itself})."""
    if cache.exists():
        stored = json.loads(cache.read_text())
        return stored["queries"], stored["own"]
    tok = policy.tokenizer
    queries, own = {}, {}
    for dataset, rows in evals.items():
        prompts = [tok(build_prompt(tok, r["question"]), add_special_tokens=False)["input_ids"] for r in rows]
        texts = generate(policy, prompts, 64, SEARCH_STOP, temperature=0.0, batch=batch)
        parsed = [parse_search(t) for t in texts]
        queries[dataset] = [q or search_query(r["question"]) for q, r in zip(parsed, rows, strict=True)]
        own[dataset] = sum(q is not None for q in parsed) / len(rows)
    cache.write_text(json.dumps({"queries": queries, "own": own}, indent=1))
    return queries, own


# ----------------------------------------------------------------------------- rollouts
def rollouts(policy: PolicyModel, retriever: RetrieverModel, doc_vecs, ids, docs, rows, args, rng, generate: bool,
             reference: RetrieverModel | None = None):  # fmt: skip
    """G trajectories per question, as the policy service records them: the first search (the question) samples
    `top_k` of M candidates from p_phi at the rollout temperature; with `generate` the frozen policy answers (EM
    reward), else no answer is generated (the target needs only the candidates). With `reference`, the candidates
    are still p_phi's top M, but their recorded (deployed) scores are the reference tower's: the posterior's prior
    and the `mu` KL then stay anchored to it instead of moving with the student (`--prior-from start`)."""
    tok = policy.tokenizer
    queries = [search_query(r["question"]) for r in rows]
    scores, index = top_candidates(retriever, doc_vecs, queries, args.candidates)
    if reference is not None:
        with torch.no_grad():
            q = torch.from_numpy(reference.query.encode(queries, kind="query"))  # (B, H)
            scores = torch.einsum("bh,bmh->bm", q, doc_vecs[index])  # (B, M): the same candidates, its scores
    records, contexts = [], []
    for n, (row, query) in enumerate(zip(rows, queries, strict=True)):
        candidate_ids = [ids[i] for i in index[n].tolist()]
        for g in range(args.group):
            search = sample_search(tok, row["question"], candidate_ids, scores[n].numpy(), docs, rng,
                                   shown=args.top_k, temperature=args.retrieval_temperature, query=query)  # fmt: skip
            search.step.retriever_version = "trainer"
            contexts.append(search.prompt_ids + search.observation_ids)
            records.append(TrajectoryRecord(
                id=f"{row['id']}-{g}", item_id=str(row["id"]), group_index=g, question=row["question"],
                golden_answers=row["golden_answers"], prompt=search.prompt, prompt_ids=search.prompt_ids,
                turns=[TurnRecord(generated_ids=[], generated_logprobs=[], text="",
                                  observation_ids=search.observation_ids, search=search.step)],
                answer=None, policy_version="frozen", retriever_version="trainer", reward=0.0, created_at=0.0,
            ))  # fmt: skip
    if generate:
        for record, text in zip(records, answer_texts(policy, contexts, args), strict=True):
            record.answer = extract_answer(text)
            record.reward = exact_match(record.answer, record.golden_answers or [])
    return records


def answer_texts(policy: PolicyModel, contexts: list[list[int]], args) -> list[str]:
    """The frozen policy's answer to each context, sampled at the rollout temperature."""
    return generate(policy, contexts, args.answer_tokens, ANSWER_STOP, args.rollout_temperature, args.generate_batch)


def generate(policy: PolicyModel, contexts: list[list[int]], max_new: int, stop: str, temperature: float,
             batch: int) -> list[str]:  # fmt: skip
    """The frozen policy's continuation of each context up to `stop` (greedy at temperature 0), in batches."""
    tok = policy.tokenizer
    pad = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
    sampling = {"do_sample": True, "temperature": temperature, "top_k": 0, "top_p": 1.0} if temperature > 0 else {
        "do_sample": False}  # fmt: skip
    texts = []
    for start in range(0, len(contexts), batch):
        chunk = contexts[start : start + batch]
        width = max(map(len, chunk))
        input_ids = torch.full((len(chunk), width), pad)
        mask = torch.zeros((len(chunk), width), dtype=torch.long)
        for i, ids in enumerate(chunk):  # left padding: the continuations line up
            input_ids[i, width - len(ids) :] = torch.tensor(ids)
            mask[i, width - len(ids) :] = 1
        with torch.no_grad(), policy.model.disable_adapter():  # the LoRA is B = 0: the warm start itself
            out = policy.model.generate(input_ids=input_ids, attention_mask=mask, max_new_tokens=max_new,
                                        pad_token_id=pad, stop_strings=[stop], tokenizer=tok, **sampling)  # fmt: skip
        texts += tok.batch_decode(out[:, width:], skip_special_tokens=True)
    return texts


# ----------------------------------------------------------------------------- the arms
def supervised_step(retriever: RetrieverModel, doc_vecs, ids, rows, optimizer, args) -> float:
    """K steps (as every arm takes per batch) of InfoNCE over each question's top candidates plus its gold
    passages, -log sum_gold softmax(cos / T); the candidates drawn once, at the batch's start."""
    index_of = {d: i for i, d in enumerate(ids)}
    queries = [search_query(r["question"]) for r in rows]
    _, index = top_candidates(retriever, doc_vecs, queries, args.candidates)
    pools = []
    for n, row in enumerate(rows):
        gold = [index_of[d] for d in supporting(row) if d in index_of]
        pools.append((len(gold), list(dict.fromkeys(gold + index[n].tolist()))))
    value = 0.0
    for _ in range(args.steps):
        optimizer.zero_grad()
        vectors = retriever.query(queries)  # (B, H), differentiable
        losses = [-torch.logsumexp(torch.log_softmax(doc_vecs[pool] @ vectors[n] / args.retrieval_temperature,
                                                     dim=-1)[:n_gold], dim=-1)
                  for n, (n_gold, pool) in enumerate(pools)]  # fmt: skip
        loss = torch.stack(losses).mean()
        loss.backward()
        optimizer.step()
        value = float(loss.detach())
    return value


def algo_config(arm: str, args, steps: int) -> AlgoConfig:
    return AlgoConfig(algo="retriever-only", retriever_objective=arm, group_size=args.group, q_steps=args.batch,
                      q_candidates=args.q_candidates, retriever_lr=args.lr, retriever_steps=args.steps,
                      seed=args.seed, lr_schedule="constant", retriever_params=args.retriever_params,
                      q_prior=args.q_prior, beta_q=args.beta_q,
                      q_informative_only=args.q_informative_only)  # fmt: skip


def run_arm(arm: str, models, policy, doc_vecs, ids, docs, questions, evals, args, out: Path,
            policy_queries: dict[str, list[str]]) -> dict:  # fmt: skip
    """One arm from the start: batches in order, recall on the training datasets' evaluation split every
    `--eval-every` batches; resumes from its last saved batch."""
    folder = out / arm
    folder.mkdir(parents=True, exist_ok=True)
    progress_file = folder / "progress.json"
    tower = folder / "query_encoder.safetensors"  # in LoRA mode only its adapter is written (save_trained)
    resume = progress_file.exists()
    retriever = RetrieverModel(models.retriever, tower if resume else None, seed=args.seed,
                               params=args.retriever_params)  # fmt: skip
    retriever.use_doc_vectors(ids, doc_vecs)  # e_d of the index itself: p_phi scores those
    reference = None
    if args.prior_from == "start" and arm == "target":  # the start tower, frozen (the LoRA starts at B = 0)
        reference = RetrieverModel(models.retriever, None)
    batches = [questions[i : i + args.batch] for i in range(0, len(questions), args.batch)]
    cfg = algo_config("both" if arm == "supervised" else arm, args, len(batches))  # supervised: its own Adam
    progress = {"done": 0, "curve": [], "losses": [], "rewards": []}
    optim = RoundOptimizers(cfg, len(batches))
    adam = torch.optim.Adam(RetrieverModel.trainable(retriever.query), lr=args.lr)
    if resume:
        progress = json.loads(progress_file.read_text())
        optim = RoundOptimizers(cfg, len(batches), folder / "optimizer") if arm != "supervised" else optim
        if arm == "supervised":
            adam.load_state_dict(torch.load(folder / "adam.pt"))
    train_sets = {d: evals[d] for d in args.train_datasets if d in evals}
    started = time.perf_counter()
    for b in tqdm(range(progress["done"], len(batches)), desc=arm, initial=progress["done"], total=len(batches)):
        rows = batches[b]
        rng = np.random.default_rng(args.seed * 1_000_003 + b)  # the same draws in every arm at the same phi
        if arm == "supervised":
            progress["losses"].append(supervised_step(retriever, doc_vecs, ids, rows, adam, args))
        else:
            records = rollouts(policy, retriever, doc_vecs, ids, docs, rows, args, rng, generate=arm != "target",
                               reference=reference)  # fmt: skip
            batch = build_batch(records, cfg.model_copy(update={"seed": args.seed + b}), policy.tokenizer, docs)
            stats = train_round(policy, retriever, batch, cfg, cfg.initial_lambda, optim)
            progress["losses"].append(stats.get("loss/retriever", 0.0))
            progress["rewards"].append(float(batch.rewards.mean()))
        progress["done"] = b + 1
        if progress["done"] % args.eval_every == 0 or progress["done"] == len(batches):
            now = evaluate(retriever, doc_vecs, ids, docs, train_sets, policy_queries)
            progress["curve"].append({"batch": progress["done"], **{
                d: {k: mean(v) for k, v in r.items()} for d, r in now.items()}})  # fmt: skip
            retriever.save_trained(folder, tower.name)
            if arm == "supervised":
                torch.save(adam.state_dict(), folder / "adam.pt")
            else:
                optim.save(folder / "optimizer")
            progress["train_s"] = progress.get("train_s", 0.0) + time.perf_counter() - started
            started = time.perf_counter()
            progress_file.write_text(json.dumps(progress, indent=1))
    return {"progress": progress, "after": evaluate(retriever, doc_vecs, ids, docs, evals, policy_queries)}


# ----------------------------------------------------------------------------- report
def compare(before: list, after: list) -> dict:
    pairs = [(a, b) for a, b in zip(before, after, strict=True) if a is not None]
    test = sign_test([a for a, _ in pairs], [b for _, b in pairs])
    return {"before": float(np.mean([a for a, _ in pairs])), "after": float(np.mean([b for _, b in pairs])),
            "up": test.better, "down": test.worse, "p": test.p}  # fmt: skip


def report(start: dict, arms: dict, args, elapsed: float) -> str:
    lines = [f"# The lower level alone ({elapsed / 60:.1f} min wall)", "", f"`{args.command}`", "",
             f"{len(arms)} arms x {args.questions} training questions of {', '.join(args.train_datasets)} in batches "
             f"of {args.batch} (G {args.group} rollouts each for credit/both), M {args.candidates}, top-{args.top_k}, "
             f"retrieval temperature {args.retrieval_temperature}, lr {args.lr}, K {args.steps}, "
             f"{getattr(args, 'retriever_params', 'full')} query tower, q_prior {getattr(args, 'q_prior', True)}, "
             f"beta_Q {getattr(args, 'beta_q', 1.0)}, prior from {getattr(args, 'prior_from', 'current')}, "
             f"Q only where informative {getattr(args, 'q_informative_only', False)}; "
             f"exact search "
             f"over {args.corpus_count} passages; evaluation split (first {EVAL_SPLIT}) of each dataset.", "",
             "| dataset | metric | start | " + " | ".join(arms) + " |",
             "|---|---|---|" + "---|" * len(arms)]  # fmt: skip
    for dataset in start:
        for metric in start[dataset]:  # answer@3: a top-3 passage writes a gold alias; /policy: its own query
            cells = []
            for arm in arms:
                c = compare(start[dataset][metric], arms[arm]["after"][dataset][metric])
                cells.append(f"{c['after']:.3f} (+{c['up']}/-{c['down']}, p {c['p']:.2g})")
            base = mean(start[dataset][metric])
            lines.append(f"| {dataset} | {metric} | {base:.3f} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def plot(arms: dict, start_curve: dict, out: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    datasets = list(start_curve)
    metrics = list(next(iter(start_curve.values())))
    fig, axes = plt.subplots(len(metrics), len(datasets), figsize=(4.5 * len(datasets), 3.2 * len(metrics)),
                             squeeze=False)  # fmt: skip
    for row, metric in zip(axes, metrics, strict=True):
        for ax, dataset in zip(row, datasets, strict=True):
            for arm, result in arms.items():
                curve = result["progress"]["curve"]
                xs = [0] + [c["batch"] for c in curve]
                ys = [start_curve[dataset][metric]] + [c[dataset][metric] for c in curve]
                ax.plot(xs, ys, marker=".", label=arm)
            ax.set(title=f"{dataset}: {metric}", xlabel="batches", ylabel=metric)
            ax.legend(fontsize=7)
    fig.tight_layout()
    path = out / "recall.png"
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--qa-dir", type=Path, required=True)
    parser.add_argument("--corpus-dir", type=Path, required=True)
    parser.add_argument("--train-datasets", type=lambda s: s.split(","), default=["2wikimultihopqa", "hotpotqa"])
    parser.add_argument("--arms", type=lambda s: s.split(","), default=list(ARMS))
    parser.add_argument("--questions", type=int, default=256, help="Training questions, each seen once.")
    parser.add_argument("--batch", type=int, default=8, help="Questions per retriever update (= Q samples).")
    parser.add_argument("--group", type=int, default=4, help="G rollouts per question (credit, both).")
    parser.add_argument("--candidates", type=int, default=20, help="M: candidates p_phi covers.")
    parser.add_argument("--top-k", type=int, default=3)
    parser.add_argument("--q-candidates", type=int, default=5)
    parser.add_argument("--retrieval-temperature", type=float, default=0.05)
    parser.add_argument("--rollout-temperature", type=float, default=1.0)
    parser.add_argument("--answer-tokens", type=int, default=24)
    parser.add_argument("--generate-batch", type=int, default=16)
    parser.add_argument("--lr", type=float, default=2e-5)
    parser.add_argument("--retriever-params", choices=["full", "lora"], default="full",
                        help="What trains: the whole query tower, or a query-side LoRA (the paper's).")  # fmt: skip
    parser.add_argument("--q-prior", action=argparse.BooleanOptionalAction, default=True,
                        help="Q_theta as the posterior p_phi0(d) pi(y*|x,d)^(1/beta_Q) (AlgoConfig.q_prior, the "
                        "default); --no-q-prior: the likelihood alone (sections 18-19's `target`).")  # fmt: skip
    parser.add_argument("--beta-q", type=float, default=1.0, help="Q_theta's temperature beta_Q.")
    parser.add_argument("--prior-from", choices=["current", "start"], default="current",
                        help="The posterior's prior (and the mu KL): the tower at each batch's start, as a live "
                        "round has it, or the frozen start tower (target arm only; docs/results.md 19d)")  # fmt: skip
    parser.add_argument(
        "--q-informative-only",
        action=argparse.BooleanOptionalAction,
        default=False,
        help="Q_theta targets only where the candidates differ in holding y* and y* is no yes/no "
        "label (AlgoConfig.q_informative_only).",
    )
    parser.add_argument("--steps", type=int, default=4, help="K: retriever steps per batch.")
    parser.add_argument("--eval-every", type=int, default=8)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--work", type=Path, default=REPO / ".cache" / "lower-level")
    parser.add_argument("--out", type=Path, default=REPO / "docs" / "results" / "lower-level")
    return parser


def frozen_warm_start(work: Path, seed: int, adapter: Path | None = None):
    """The tiny models under `work` and the warm-started policy (the shipped adapter, or `adapter`), frozen: it only
    scores Q_theta and answers, so it runs in the precision vLLM serves it in."""
    from services.cli.prepare import prepare_warmstart_model
    from services.common.hardware import resolve_dtype

    models = prepare_models(work)
    warm = work / "models" / ("warmstart" if adapter is None else f"warmstart-{adapter.resolve().name}")
    prepare_warmstart_model(warm, models.policy, adapter)
    return models, PolicyModel(warm, None, 8, 16, seed=seed, dtype=getattr(torch, resolve_dtype("auto")))


def main() -> None:
    import shlex
    import sys

    args = build_parser().parse_args()
    args.command = "python -m experiments.lower_level " + shlex.join(sys.argv[1:])
    started = time.perf_counter()
    torch.manual_seed(args.seed)
    models, policy = frozen_warm_start(args.work, args.seed)
    docs = load_corpora(args.corpus_dir)
    ids = list(docs)
    args.corpus_count = len(ids)
    doc_vecs = doc_matrix(models.retriever, docs, args.work / "doc_vectors.pt")
    evals = eval_rows(args.qa_dir)
    questions = train_questions(args.qa_dir, args.train_datasets, args.questions, args.seed)
    args.out.mkdir(parents=True, exist_ok=True)
    policy_queries, own = policy_first_queries(policy, evals, args.out / "policy_queries.json")
    start = evaluate(RetrieverModel(models.retriever, None), doc_vecs, ids, docs, evals, policy_queries)
    arms = {arm: run_arm(arm, models, policy, doc_vecs, ids, docs, questions, evals, args, args.out, policy_queries)
            for arm in args.arms}  # fmt: skip
    start_curve = {d: {m: mean(v) for m, v in start[d].items()} for d in args.train_datasets if d in start}
    plot(arms, start_curve, args.out)
    elapsed = time.perf_counter() - started
    results = {"command": args.command, "start": start, "arms": arms, "policy_searched": own, "wall_s": elapsed}
    (args.out / "results.json").write_text(json.dumps(results, indent=1))
    text = report(start, arms, args, elapsed)
    (args.out / "results.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
