"""Learning runs from the warm start (issue 13, section 3): same start, same training questions, same seeds.

Starts the embedded stack (Redis, retriever, vLLM policy, a Celery worker) on `--data-dir`, ingests each
`--corpus` (unchanged passages are skipped, so a second run re-embeds nothing), evaluates the start on the
evaluation split (the first `--eval-questions` of each `--eval-datasets` file), then for each algorithm puts both
services back on `base` (the merged warm start and the base encoder), trains `--rounds` rounds on the training
pool of `--train-dataset` (services/data/split.py: never the evaluation split)
and evaluates what it published on the same questions.

Reports, per algorithm: the training reward per round (every trajectory of the round's first collection), the mean
of the first and last three rounds and a bootstrap 95 % interval of their difference; evaluation-split EM / F1 /
recall@3 before and after, per dataset and group, with an exact paired sign test against the start and against
`search-r1`. Nothing is tuned on the evaluation split.

    python -m experiments.learning --data-dir .cache/learning --qa-dir ../shared/data/qa \
        --corpus ../shared/data/corpus/nq.jsonl ../shared/data/corpus/hotpotqa.jsonl \
        --algos search-r1 bridge --train-dataset nq --eval-datasets nq,hotpotqa \
        --adapter-serving merged --out docs/results/learning
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shlex
import sys
import time
from pathlib import Path

from experiments.compare_algos import reset_to_base, run_rounds
from services.common.checkpoints import write_json_atomic
from services.common.schemas.policy import TrajectoryRecord
from services.data.datasets import GROUP_OF, load_items
from services.data.split import EVAL_SPLIT
from services.eval.scoring import ItemResult
from services.eval.stats import bootstrap_mean_diff, sign_test
from services.trainer.algo.config import AlgoConfig
from services.trainer.run_state import RunConfig

ALGOS = ("search-r1", "bridge", "alt-rp", "alt-pr", "joint", "retriever-only")
METRICS = ("em", "f1", "recall")


def evaluate(stack, items, max_turns: int) -> list[ItemResult]:
    from services.eval.runner import evaluate as run_eval

    return asyncio.run(run_eval(stack.policy_url, [(i, "agent") for i in items], concurrency=16,
                                max_turns=max_turns, top_k=3))  # fmt: skip


def algo_config(args: argparse.Namespace, algo: str, **fields) -> AlgoConfig:
    """`algo` with what every learning experiment sets from its shared run options (`add_run_args`): the seed
    and the policy's update size; `fields` are the experiment's own."""
    return AlgoConfig(algo=algo, seed=args.seed, policy_steps=args.policy_steps, policy_lr=args.policy_lr, **fields)


def run_config(args: argparse.Namespace, algo: str) -> RunConfig:
    """The run every algorithm gets from the same flags (same questions, seed and update size)."""
    return RunConfig(run_id=f"learn-{algo}-s{args.seed}-{int(time.time())}", dataset=args.train_dataset,
                     rounds=args.rounds, questions_per_round=args.questions_per_round, max_turns=args.max_turns,
                     reward=args.reward,
                     algo=algo_config(args, algo, group_size=args.group_size,
                                      **({} if args.gamma is None else {"gamma": args.gamma})))  # fmt: skip


def train(stack, args: argparse.Namespace, algo: str) -> str:
    return run_rounds(stack, run_config(args, algo))


def round_records(runs_dir: Path, run_id: str) -> list[list[TrajectoryRecord]]:
    """Per round, every trajectory of its first collection (what each algorithm trains on)."""
    from services.trainer.rollout import load_round_rollouts

    rounds = sorted((runs_dir / run_id).glob("round-*/rollouts.json"))
    return [load_round_rollouts(path)[1] for path in rounds]


def round_rewards(runs_dir: Path, run_id: str) -> list[list[float]]:
    """Per round, the reward of every trajectory of its first collection."""
    return [[r.reward or 0.0 for r in records] for records in round_records(runs_dir, run_id)]


def per_question(results: list[ItemResult]) -> dict[tuple[str, str], ItemResult]:
    return {(r.dataset, r.id): r for r in results}


def compare(before: list[ItemResult], after: list[ItemResult], datasets: list[str]) -> dict[str, dict]:
    """Per dataset, per group and overall: mean of each metric before/after and the paired sign test."""
    b, a = per_question(before), per_question(after)
    scopes = {d: [k for k in b if k[0] == d] for d in datasets}
    for group in sorted({GROUP_OF.get(d, "other") for d in datasets}):
        scopes[f"group:{group}"] = [k for k in b if GROUP_OF.get(k[0], "other") == group]
    scopes["all"] = list(b)
    out: dict[str, dict] = {}
    for scope, keys in scopes.items():
        row: dict[str, object] = {"n": len(keys)}
        for metric in METRICS:
            pairs = [(getattr(b[k], metric), getattr(a[k], metric)) for k in keys if k in a]
            pairs = [(x, y) for x, y in pairs if x is not None and y is not None]
            if not pairs:
                continue
            xs, ys = [x for x, _ in pairs], [y for _, y in pairs]
            row[metric] = {"before": sum(xs) / len(xs), "after": sum(ys) / len(ys),
                           "sign": sign_test(xs, ys).model_dump()}  # fmt: skip
        out[scope] = row
    return out


def plot_rewards(out: Path, rewards: dict[str, list[list[float]]]) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    fig, ax = plt.subplots(figsize=(6, 3.5))
    for algo, rounds in rewards.items():
        means = [sum(r) / len(r) for r in rounds]
        ax.plot(range(len(means)), means, marker="o", label=algo)
    ax.set(xlabel="round", ylabel="training reward, mean per round", title="training reward per round")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.legend(fontsize=8)
    fig.tight_layout()
    path = out / "reward_per_round.png"
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def report(args, elapsed: float, start: list[ItemResult], runs: dict[str, dict]) -> str:
    datasets = args.eval_datasets
    schedule = f"held at {args.gamma if args.gamma is not None else AlgoConfig().gamma:g}"
    lines = [f"# Learning runs from the warm start ({elapsed / 60:.1f} min wall)", "",
             f"`{args.command}`", "",
             f"Training: {args.rounds} rounds x {args.questions_per_round} questions x G {args.group_size} on the "
             f"training pool of {args.train_dataset} (after its first {EVAL_SPLIT}), max {args.max_turns} searches, "
             f"reward {args.reward}, policy {args.policy_steps} step(s) a round at lr {args.policy_lr:g}, "
             f"seed {args.seed}; lambda {schedule}; "
             f"trained policies served {args.adapter_serving}. "
             f"Evaluation: the first {args.eval_questions} questions of "
             f"{', '.join(datasets)}, agent mode, greedy, top-3.", "",
             "## Training reward", "",
             "| algo | rounds | first 3 rounds | last 3 rounds | last - first (bootstrap 95 %) | significant |",
             "|---|---|---|---|---|---|"]  # fmt: skip
    for algo, run in runs.items():
        d = run["reward_diff"]
        lines.append(f"| {algo} | {len(run['rewards'])} | {d['before']:.3f} | {d['after']:.3f} | "
                     f"{d['diff']:+.3f} [{d['low']:+.3f}, {d['high']:+.3f}] | "
                     f"{'yes' if d['low'] > 0 or d['high'] < 0 else 'no'} |")  # fmt: skip
    lines += ["", "## Evaluation split, before and after", "",
              "Sign test: questions better / worse (ties dropped), exact two-sided p.", "",
              "| algo | scope | n | EM start -> after (sign p) | F1 start -> after (sign p) | recall@3 start -> after "
              "(sign p) | EM vs search-r1 (sign p) |", "|---|---|---|---|---|---|---|"]  # fmt: skip

    def cell(row: dict, metric: str) -> str:
        m = row.get(metric)
        if not m:
            return "–"
        s = m["sign"]
        return f"{m['before']:.3f} -> {m['after']:.3f} (+{s['better']}/-{s['worse']}, p={s['p']:.2g})"

    for algo, run in runs.items():
        for scope, row in run["vs_start"].items():
            vs = run.get("vs_search_r1", {}).get(scope, {}).get("em")
            other = f"+{vs['sign']['better']}/-{vs['sign']['worse']}, p={vs['sign']['p']:.2g}" if vs else "–"
            lines.append(f"| {algo} | {scope} | {row['n']} | {cell(row, 'em')} | {cell(row, 'f1')} | "
                         f"{cell(row, 'recall')} | {other} |")  # fmt: skip
    lines += ["", f"![reward per round]({plot_rewards(args.out, {a: r['rewards'] for a, r in runs.items()}).name})"]
    start_em = sum(r.em for r in start) / max(len(start), 1)
    lines += ["", f"Start (merged warm start, base encoder): EM {start_em:.3f} over {len(start)} questions."]
    return "\n".join(lines) + "\n"


def add_run_args(parser: argparse.ArgumentParser, *, out: Path, port_base: int) -> None:
    """The options every learning experiment shares: data, evaluation split, turn budget, seed, output, ports."""
    parser.add_argument("--data-dir", type=Path, required=True, help="Holds models and the ingested index.")
    parser.add_argument("--qa-dir", type=Path, required=True, help="<dataset>.jsonl files (e.g. ../shared/data/qa).")
    parser.add_argument("--train-dataset", default="nq", help="Trains on its training pool (after the first 100).")
    parser.add_argument("--eval-datasets", type=lambda s: [d for d in s.split(",") if d], default=["nq", "hotpotqa"])
    parser.add_argument("--eval-questions", type=int, default=EVAL_SPLIT)
    parser.add_argument("--max-turns", type=int, default=2)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=out)
    parser.add_argument("--policy-port", type=int, default=port_base)
    parser.add_argument("--retriever-port", type=int, default=port_base + 1)
    parser.add_argument("--vllm-port", type=int, default=port_base + 11)
    parser.add_argument("--policy-steps", type=int, default=1, help="Optimizer steps on the policy per round.")
    parser.add_argument("--policy-lr", type=float, default=1e-4, help="Adam step size for the policy's LoRA.")
    parser.add_argument("--adapter-serving", choices=("auto", "lora", "merged"), default="auto",
                        help="How vLLM serves trained policies (BRIDGE_POLICY_ADAPTER_SERVING): merged runs them at "
                        "the base model's speed on CPU, LoRA there is several times slower.")  # fmt: skip


def setup_run(parser: argparse.ArgumentParser, args: argparse.Namespace, module: str) -> str:
    """Refuse an evaluation that would read the training pool, make `--out`, point the embedded stack at the data
    dir; returns the command line that reproduces the run."""
    if args.eval_questions > EVAL_SPLIT:
        parser.error(f"--eval-questions above {EVAL_SPLIT} would read the training pool")
    args.out.mkdir(parents=True, exist_ok=True)
    os.environ.update({
        "BRIDGE_DATA_DIR": str(args.data_dir.resolve()),
        "BRIDGE_TRAINER_QA_DIR": str(args.qa_dir.resolve()),
        "BRIDGE_POLICY_MAX_NEW_TOKENS": str(args.max_new_tokens),
        "BRIDGE_POLICY_VLLM_PORT": str(args.vllm_port),
        "BRIDGE_POLICY_ADAPTER_SERVING": args.adapter_serving,
        # Its own queue: another worker on this Redis never takes these rounds.
        "BRIDGE_TRAINER_QUEUE": f"bridge-{module.rsplit('.', 1)[-1]}-{os.getpid()}",
    })  # fmt: skip
    return f"python -m {module} " + shlex.join(sys.argv[1:])


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_run_args(parser, out=Path("docs/results/learning"), port_base=8300)
    parser.add_argument("--algos", nargs="+", choices=ALGOS, default=["search-r1", "bridge"])
    parser.add_argument("--corpus", type=Path, nargs="*", default=[], help="Corpus JSONL files to ingest first.")
    parser.add_argument("--reward", choices=("em", "f1", "em-format"), default="em", help="Training reward.")
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--questions-per-round", type=int, default=8)
    parser.add_argument("--group-size", type=int, default=4)
    parser.add_argument("--gamma", type=float, default=None,
                        help="Hold lambda at this value (AlgoConfig.gamma; default: AlgoConfig's, the paper's 0.02); "
                        "--gamma 1 makes bridge's update alt-rp's.")  # fmt: skip
    return parser


def main() -> None:
    parser = build_parser()
    args = parser.parse_args()
    args.command = setup_run(parser, args, "experiments.learning")
    from services.cli.ingest import ingest_file
    from services.cli.launcher import Stack
    from services.cli.prepare import prepare_all
    from services.common.clients.retriever import RetrieverClient
    from services.common.settings import CommonSettings

    settings = CommonSettings()
    prepare_all(settings)
    items = [i for d in args.eval_datasets for i in load_items(args.qa_dir, d, args.eval_questions)]
    started = time.time()
    runs: dict[str, dict] = {}
    with Stack(
        settings, policy_port=args.policy_port, retriever_port=args.retriever_port, console_port=args.policy_port + 2
    ) as stack:
        with RetrieverClient(stack.retriever_url, admin_token=settings.resolve_admin_token(), timeout=600) as client:
            for corpus in args.corpus:
                print(ingest_file(client, corpus), flush=True)
        start = evaluate(stack, items, args.max_turns)
        print(f"start: EM {sum(r.em for r in start) / len(start):.3f} ({len(start)} questions)", flush=True)
        for algo in args.algos:
            reset_to_base(stack)
            run_id = train(stack, args, algo)
            after = evaluate(stack, items, args.max_turns)
            rewards = round_rewards(settings.data_dir / "runs", run_id)
            first = [x for r in rewards[:3] for x in r]
            last = [x for r in rewards[-3:] for x in r]
            runs[algo] = {"run_id": run_id, "rewards": rewards,
                          "reward_diff": bootstrap_mean_diff(first, last, seed=args.seed).model_dump(),
                          "vs_start": compare(start, after, args.eval_datasets),
                          "results": [r.model_dump() for r in after]}  # fmt: skip
            if algo != "search-r1" and "search-r1" in runs:
                baseline = [ItemResult(**r) for r in runs["search-r1"]["results"]]
                runs[algo]["vs_search_r1"] = compare(baseline, after, args.eval_datasets)
            print(f"{algo}: EM {sum(r.em for r in after) / len(after):.3f} ({run_id})", flush=True)
            # After each algorithm, so an interrupted comparison still leaves its report.
            elapsed = time.time() - started
            (args.out / "results.md").write_text(report(args, elapsed, start, runs))
            write_json_atomic(args.out / "results.json", {"command": args.command, "elapsed_s": elapsed,
                              "start": [r.model_dump() for r in start], "runs": runs})  # fmt: skip
        reset_to_base(stack)
    print((args.out / "results.md").read_text())
    print(json.dumps({a: r["reward_diff"] for a, r in runs.items()}, indent=1))


if __name__ == "__main__":
    main()
