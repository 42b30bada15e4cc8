"""Every `--algo` from the same start with the same budget, evaluated on one fixed held-out split.

Starts the embedded stack (Redis, retriever, vLLM policy, a Celery worker) in its own data dir, loads the
corpus, evaluates the base system, then for each algorithm: puts both services back on `base`, trains
`rounds` rounds through the worker (rollouts on the train split), and evaluates the versions it published on
the eval split (the agent, greedy). Writes results.md (a table), results.json and PNG plots (reward, EM and
recall@k per round; held-out EM/F1/cover/recall per algorithm).

    python -m experiments.compare_algos --budget small --qa-file ../shared/data/qa/hotpotqa.jsonl \
        --corpus ../shared/data/corpus/hotpotqa.jsonl     # 2-core CPU: within an hour
    # a real run, on a GPU machine:
    python -m experiments.compare_algos --budget gpu --qa-file ../shared/data/qa/hotpotqa.jsonl
        --corpus ../shared/data/corpus/hotpotqa.jsonl
"""

from __future__ import annotations

import argparse
import asyncio
import os
import time
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path

from bench.script import DEMO_DATA as DEMO
from bench.script import RESULTS
from services.common.checkpoints import write_json_atomic
from services.data.datasets import EvalItem, load_items
from services.data.split import EVAL_SPLIT
from services.eval.scoring import ItemResult, summarize

ALGOS = ("search-r1", "retriever-only", "alt-rp", "alt-pr", "joint", "bridge")


@dataclass(frozen=True)
class Budget:
    rounds: int
    questions_per_round: int
    group_size: int
    max_turns: int
    eval_questions: int
    max_new_tokens: int


BUDGETS = {
    # 6 algos x 2 rounds x 4 questions x G=2 with 64-token turns, 20 held-out questions: < 1 h on 2 CPU cores.
    "small": Budget(rounds=2, questions_per_round=4, group_size=2, max_turns=1, eval_questions=20, max_new_tokens=64),
    "gpu": Budget(rounds=20, questions_per_round=32, group_size=8, max_turns=4, eval_questions=200,
                  max_new_tokens=256),
}  # fmt: skip


def split(qa_file: Path, eval_questions: int, out: Path) -> tuple[Path, list[EvalItem]]:
    """The split rule (services/data/split.py): evaluation on the first `eval_questions` of the file's evaluation
    split (its first EVAL_SPLIT lines), training only on the lines after that split (its own qa dir)."""
    lines = [line for line in qa_file.read_text().splitlines() if line.strip()]
    if qa_file.stem.endswith("_train"):
        raise SystemExit(f"{qa_file} is a training-pool file: it has no evaluation split; pass a benchmark file")
    if eval_questions > EVAL_SPLIT:
        raise SystemExit(f"--eval-questions {eval_questions}: the evaluation split has only {EVAL_SPLIT} questions")
    if len(lines) <= EVAL_SPLIT:
        raise SystemExit(f"{qa_file} has {len(lines)} questions: none after its {EVAL_SPLIT}-question evaluation split")
    train_dir, eval_dir = out / "qa" / "train", out / "qa" / "eval"
    # The training side is a `_train` file: training reads all of it (services/data/split.py).
    for file, rows in ((train_dir / "compare_train.jsonl", lines[EVAL_SPLIT:]),
                       (eval_dir / "compare.jsonl", lines[:eval_questions])):  # fmt: skip
        file.parent.mkdir(parents=True, exist_ok=True)
        file.write_text("\n".join(rows) + "\n")
    return train_dir, load_items(eval_dir, "compare", None)


def evaluate(stack, items: list[EvalItem], budget: Budget) -> tuple[dict, list[ItemResult]]:
    from services.eval.runner import evaluate as run_eval

    work = [(item, "agent") for item in items]
    results = asyncio.run(run_eval(stack.policy_url, work, concurrency=16, max_turns=budget.max_turns, top_k=3))
    [row] = summarize(results)
    return row.model_dump(), results


def reset_to_base(stack) -> None:
    from services.common.clients.policy import PolicyClient
    from services.common.clients.retriever import RetrieverClient
    from services.eval.pinning import activate_and_wait

    token = stack.settings.resolve_admin_token()
    with RetrieverClient(stack.retriever_url, admin_token=token, timeout=600) as retriever:
        activate_and_wait(retriever, "base")
    with PolicyClient(stack.policy_url, admin_token=token) as policy:
        activate_and_wait(policy, "base")


def run_rounds(stack, config) -> str:
    """Start the run `config` (a RunConfig) on the stack's worker and follow it to the end, with a progress bar."""
    from tqdm import tqdm

    from services.trainer.round_files import start_run
    from services.trainer.settings import TrainerSettings
    from services.trainer.submit import enqueue, follow

    settings = TrainerSettings(data_dir=stack.settings.data_dir, redis_url=stack.redis_url,
                               policy_url=stack.policy_url, retriever_url=stack.retriever_url)  # fmt: skip
    start_run(settings, config)
    enqueue(settings, config.run_id, 0)
    with tqdm(total=config.rounds, desc=f"train {config.algo.algo}", unit="round") as bar:
        state = follow(settings, config.run_id, lambda done: done > bar.n and bar.update(done - bar.n), poll_s=2.0)
    if state.status == "failed":
        raise RuntimeError(f"{config.algo.algo}: training failed: {state.error}")
    return config.run_id


def train(stack, algo: str, budget: Budget, seed: int, q_prior: bool = True) -> tuple[str, list[dict]]:
    from services.trainer.algo.config import AlgoConfig
    from services.trainer.run_state import RunConfig, read_metrics

    config = RunConfig(run_id=f"cmp-{algo}-s{seed}-{int(time.time())}", dataset="compare", rounds=budget.rounds,
                       questions_per_round=budget.questions_per_round, max_turns=budget.max_turns,
                       algo=AlgoConfig(algo=algo, group_size=budget.group_size, seed=seed,
                                       q_prior=q_prior))  # fmt: skip
    run_id = run_rounds(stack, config)
    return run_id, read_metrics(stack.settings.data_dir / "runs", run_id)


def plot(out: Path, curves: dict[str, list[dict]], held: dict[str, dict]) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    paths = []
    for key, label, name in (("reward/mean", "rollout reward (EM)", "reward"), ("em/mean", "rollout EM", "em"),
                             ("recall/support", "recall@k of supporting docs (rollouts)", "recall")):  # fmt: skip
        fig, ax = plt.subplots(figsize=(6, 3.5))
        for algo, rows in curves.items():
            ax.plot([r["round"] for r in rows], [r.get(key, float("nan")) for r in rows], marker="o", label=algo)
        ax.set(xlabel="round", ylabel=label, title=f"{label} per round")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.legend(fontsize=7)
        fig.tight_layout()
        paths.append(out / f"{name}_per_round.png")
        fig.savefig(paths[-1], dpi=120)
        plt.close(fig)
    metrics = ("em", "f1", "cover", "recall")
    fig, ax = plt.subplots(figsize=(7, 3.5))
    names = list(held)
    width = 0.8 / len(metrics)
    for j, metric in enumerate(metrics):
        ax.bar([i + j * width for i in range(len(names))], [held[n][metric] or 0.0 for n in names], width,
               label=metric)  # fmt: skip
    ax.set_xticks([i + 0.4 - width / 2 for i in range(len(names))], names, rotation=20, fontsize=8)
    ax.set(ylabel="held-out score", title="held-out split after training (agent, greedy)")
    ax.legend(fontsize=7)
    fig.tight_layout()
    paths.append(out / "held_out.png")
    fig.savefig(paths[-1], dpi=120)
    plt.close(fig)
    return paths


def retrieval_changes(base: list[dict], after: list[dict]) -> int:
    """Held-out questions whose shown documents differ from the base system's: did the retriever move at all,
    where recall@k alone cannot say (it stays put when one non-supporting passage replaces another)."""
    before = {r["id"]: r["retrieved_ids"] for r in base}
    return sum(r["retrieved_ids"] != before.get(r["id"]) for r in after)


def table(held: dict[str, dict], curves: dict[str, list[dict]]) -> str:
    def f(value) -> str:
        return "–" if value is None else f"{value:.3f}"

    lines = ["| algo | held EM | held F1 | held cover | held recall@3 | top-3 changed | answered | "
             "last-round reward | last-round recall | train s/round | peak MB |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for algo, row in held.items():
        rows = curves.get(algo, [])
        last = rows[-1] if rows else {}
        per_round = sum(r.get("time/train_s", 0.0) for r in rows) / max(len(rows), 1)
        lines.append(
            f"| {algo} | {f(row['em'])} | {f(row['f1'])} | {f(row['cover'])} | {f(row['recall'])} | "
            f"{row.get('retrieval_changed', '–')} | {row['answered']:.2f} | {f(last.get('reward/mean'))} | "
            f"{f(last.get('recall/support'))} | "
            f"{per_round:.0f} | {last.get('memory/peak_mb', 0):.0f} |"
        )
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--budget", choices=sorted(BUDGETS), default="small")
    for field in fields(Budget):  # each part of a budget can be changed on its own
        flag = "--" + field.name.replace("_", "-")
        parser.add_argument(flag, type=int, default=None, help=f"Override the budget's {field.name}.")
    parser.add_argument("--algos", nargs="+", choices=ALGOS, default=list(ALGOS))
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--qa-file",
        type=Path,
        required=True,
        help="A benchmark file (<dataset>.jsonl): its first 100 lines are the evaluation split.",
    )
    parser.add_argument("--corpus", type=Path, nargs="+", default=[DEMO / "hotpotqa_corpus.jsonl"])
    parser.add_argument("--out", type=Path, default=RESULTS / "compare")
    parser.add_argument(
        "--data-dir",
        type=Path,
        default=None,
        help="The stack's data dir: models, index, checkpoints, runs (default <BRIDGE_DATA_DIR>/compare).",
    )
    parser.add_argument("--policy-port", type=int, default=8200)
    parser.add_argument("--retriever-port", type=int, default=8201)
    parser.add_argument("--vllm-port", type=int, default=8211, help="The policy's vLLM server (not a default stack's).")
    parser.add_argument("--engine", choices=("vllm", "transformers"), default="vllm")
    parser.add_argument("--q-prior", action=argparse.BooleanOptionalAction, default=True,
                        help="Q_theta as the posterior (AlgoConfig.q_prior, the default); --no-q-prior: the "
                        "likelihood alone (sections 2-3 of docs/results.md ran with it).")  # fmt: skip
    args = parser.parse_args()
    changes = {f.name: getattr(args, f.name) for f in fields(Budget) if getattr(args, f.name) is not None}
    budget = replace(BUDGETS[args.budget], **changes)
    args.out.mkdir(parents=True, exist_ok=True)
    train_dir, eval_items = split(args.qa_file, budget.eval_questions, args.out)

    from services.common.settings import CommonSettings

    data_dir = args.data_dir or CommonSettings().data_dir / "compare"
    os.environ.update({
        "BRIDGE_DATA_DIR": str(data_dir),
        "BRIDGE_TRAINER_QA_DIR": str(train_dir),
        "BRIDGE_POLICY_MAX_NEW_TOKENS": str(budget.max_new_tokens),
        "BRIDGE_POLICY_VLLM_PORT": str(args.vllm_port),
        # Its own queue: another deployment's worker on the same Redis never takes these rounds.
        "BRIDGE_TRAINER_QUEUE": f"bridge-compare-{os.getpid()}",
    })  # fmt: skip
    from services.cli.ingest import ingest_file
    from services.cli.launcher import Stack
    from services.cli.prepare import prepare_all
    from services.common.clients.retriever import RetrieverClient

    settings = CommonSettings()
    prepare_all(settings)
    started = time.time()
    curves: dict[str, list[dict]] = {}
    held: dict[str, dict] = {}
    details: dict[str, list[dict]] = {}
    with Stack(settings, policy_port=args.policy_port, retriever_port=args.retriever_port, engine=args.engine) as stack:
        with RetrieverClient(stack.retriever_url, admin_token=settings.resolve_admin_token(), timeout=600) as c:
            for corpus in args.corpus:
                ingest_file(c, corpus)
        held["base"], results = evaluate(stack, eval_items, budget)
        details["base"] = [r.model_dump() for r in results]
        for algo in args.algos:
            reset_to_base(stack)
            run_id, curves[algo] = train(stack, algo, budget, args.seed, args.q_prior)
            held[algo], results = evaluate(stack, eval_items, budget)
            held[algo]["run_id"] = run_id
            details[algo] = [r.model_dump() for r in results]
            held[algo]["retrieval_changed"] = retrieval_changes(details["base"], details[algo])
            print(f"{algo}: held EM {held[algo]['em']:.3f} F1 {held[algo]['f1']:.3f} cover {held[algo]['cover']:.3f} "
                  f"recall {held[algo]['recall']} ({run_id})", flush=True)  # fmt: skip
            # After every algorithm, so an interrupted comparison still leaves its table and plots.
            report(args, budget, held, curves, details, time.time() - started, len(eval_items))
        reset_to_base(stack)
    print(report(args, budget, held, curves, details, time.time() - started, len(eval_items)))


def report(args, budget: Budget, held: dict, curves: dict, details: dict, elapsed: float, n_eval: int) -> str:
    pngs = plot(args.out, curves, held)
    text = (f"# compare_algos: budget {args.budget} {asdict(budget)}, seed {args.seed}, {n_eval} held-out "
            f"questions from {args.qa_file.name}, {elapsed / 60:.1f} min\n\n" + table(held, curves) + "\n"
            + "\n".join(f"![{p.stem}]({p.name})" for p in pngs) + "\n")  # fmt: skip
    (args.out / "results.md").write_text(text)
    write_json_atomic(args.out / "results.json",
                      {"budget": asdict(budget), "seed": args.seed, "elapsed_s": elapsed, "held": held,
                       "curves": curves, "per_question": details})  # fmt: skip
    return text


if __name__ == "__main__":
    main()
