"""Live learning, as the online system is meant to be used (issue 13, section 3).

Training-pool questions of `--train-dataset` are served through `POST /v1/agent/query` by `--clients` concurrent
clients, with the deployment's exploration on (`BRIDGE_POLICY_SERVE_TEMPERATURE`, sampled retrieval), and each
answer is rewarded through `POST /v1/feedback` with the question's gold answers, as a user's feedback would be.
Meanwhile `bridge-rl train --source live` rounds (`--rounds` of `--live-batch` rewarded trajectories) train on them
and publish into the same running services. Reported: the reward per round, the requests served and failed while
the run swapped versions under them (must be 0 failed), and evaluation-split EM / F1 / recall@3 (greedy, the
first `--eval-questions` of each `--eval-datasets` file) of the start and of what the run left active, with the
paired sign test. The evaluations run on a greedy stack; the live phase on one with exploration on (same data dir:
the registry carries the published versions across).

    python -m experiments.live_learning --data-dir .cache/learning --qa-dir ../shared/data/qa \
        --train-dataset nq --eval-datasets nq,hotpotqa --adapter-serving merged --rounds 3 --out docs/results/live
"""

from __future__ import annotations

import argparse
import os
import random
import threading
import time
from collections import Counter
from pathlib import Path

import httpx

from experiments.learning import (
    add_run_args,
    algo_config,
    compare,
    evaluate,
    round_records,
    round_rewards,
    setup_run,
)
from services.common.checkpoints import write_json_atomic
from services.common.hardware import parse_cpu_list
from services.data.datasets import load_items
from services.data.split import training_rows
from services.eval.stats import bootstrap_mean_diff


def serve_users(url: str, rows: list[dict], max_turns: int, reward: str, stop: threading.Event, counts: Counter,
                served: dict[str, list[float]], seed: int):  # fmt: skip
    """One client: ask training-pool questions in a shuffled loop, reward each answer with its gold answers.
    `served[version]` gets each reward: the online learning curve, by the policy version that answered."""
    order = random.Random(seed)
    with httpx.Client(base_url=url, timeout=900) as http:
        while not stop.is_set():
            row = order.choice(rows)
            try:
                response = http.post("/v1/agent/query", json={"question": row["question"], "max_turns": max_turns})
                if response.status_code != 200:
                    counts["failed"] += 1
                    counts[f"failed {response.status_code}"] += 1
                    continue
                counts["served"] += 1
                answer = response.json()
                version = answer["policy_version"]
                counts[f"version {version}"] += 1
                feedback = {"trajectory_id": answer["trajectory_id"], "golden_answers": row["golden_answers"],
                            "reward_kind": reward}  # fmt: skip
                scored = http.post("/v1/feedback", json=feedback)
                counts["feedback ok" if scored.status_code == 200 else "feedback failed"] += 1
                if scored.status_code == 200:
                    served.setdefault(version, []).append(scored.json()["reward"])
            except httpx.HTTPError as exc:
                counts["failed"] += 1
                counts[f"failed {type(exc).__name__}"] += 1


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_run_args(parser, out=Path("docs/results/live"), port_base=8400)
    parser.add_argument("--algo", default="bridge", choices=("search-r1", "bridge", "alt-rp", "alt-pr"))
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--live-batch", type=int, default=32, help="Rewarded trajectories per round.")
    parser.add_argument("--clients", type=int, default=8, help="Concurrent users during the live phase.")
    parser.add_argument("--serve-temperature", type=float, default=1.0, help="The deployment's exploration.")
    parser.add_argument("--reward", choices=("em", "f1", "em-format"), default="em",
                        help="How /v1/feedback scores each answer against its gold answers.")  # fmt: skip
    parser.add_argument("--trainer-cpus", default=None,
                        help="Cores the trainer worker gets (a cpu list, e.g. 1); vLLM gets the rest. Default: shared, "
                        "which on 2 cores starves a round's optimizer step behind the users' generation.")  # fmt: skip
    args = parser.parse_args()
    command = setup_run(parser, args, "experiments.live_learning")
    from experiments.compare_algos import reset_to_base, run_rounds
    from services.cli.launcher import Stack
    from services.cli.prepare import prepare_all
    from services.common.settings import CommonSettings
    from services.trainer.run_state import RunConfig

    settings = CommonSettings()
    prepare_all(settings)
    items = [i for d in args.eval_datasets for i in load_items(args.qa_dir, d, args.eval_questions)]
    pool = [row for _, row in training_rows(args.qa_dir, args.train_dataset)]
    ports = {"policy_port": args.policy_port, "retriever_port": args.retriever_port,
             "console_port": args.policy_port + 2}  # fmt: skip

    def stack(temperature: float, retrieval: str, split_cores: bool = False) -> Stack:
        os.environ["BRIDGE_POLICY_SERVE_TEMPERATURE"] = str(temperature)
        os.environ["BRIDGE_POLICY_SERVE_RETRIEVAL"] = retrieval
        for name in ("BRIDGE_TRAINER_CPUS", "VLLM_CPU_OMP_THREADS_BIND"):
            os.environ.pop(name, None)
        if split_cores and args.trainer_cpus:
            trainer = parse_cpu_list(args.trainer_cpus)
            serving = sorted(os.sched_getaffinity(0) - trainer)
            if not serving:
                parser.error(f"--trainer-cpus {args.trainer_cpus} leaves vLLM no core")
            os.environ["BRIDGE_TRAINER_CPUS"] = args.trainer_cpus
            os.environ["VLLM_CPU_OMP_THREADS_BIND"] = ",".join(map(str, serving))
        return Stack(settings, **ports)

    started = time.time()
    with stack(0.0, "greedy") as greedy:
        reset_to_base(greedy)
        start = evaluate(greedy, items, args.max_turns)
    print(f"start: EM {sum(r.em for r in start) / len(start):.3f} ({len(start)} questions)", flush=True)

    counts: Counter = Counter()
    served: dict[str, list[float]] = {}  # insertion order: the order versions went live
    config = RunConfig(run_id=f"live-{args.algo}-s{args.seed}-{int(time.time())}", source="live",
                       dataset=args.train_dataset, rounds=args.rounds, live_batch=args.live_batch,
                       max_turns=args.max_turns,
                       algo=algo_config(args, args.algo, policy_rollouts="reweighted"))  # fmt: skip
    live_started = time.time()
    with stack(args.serve_temperature, "sample", split_cores=True) as live:
        stop = threading.Event()
        user_args = (live.policy_url, pool, args.max_turns, args.reward, stop, counts, served)
        users = [threading.Thread(target=serve_users, args=(*user_args, args.seed + i), daemon=True)
                 for i in range(args.clients)]  # fmt: skip
        for user in users:
            user.start()
        try:
            run_rounds(live, config)
        finally:
            stop.set()
            for user in users:
                user.join()
    live_s = time.time() - live_started
    print(f"live: {dict(counts)} in {live_s:.0f} s", flush=True)

    with stack(0.0, "greedy") as greedy:  # the registry kept what the run published: evaluate that
        after = evaluate(greedy, items, args.max_turns)
        reset_to_base(greedy)
    rewards = round_rewards(settings.data_dir / "runs", config.run_id)
    half = max(1, len(rewards) // 2)
    first, last = [x for r in rewards[:half] for x in r], [x for r in rewards[-half:] for x in r]
    versions = [v for v, r in served.items() if len(r) >= 30]  # enough answers for a mean worth printing
    result = {"command": command, "elapsed_s": time.time() - started, "live_s": live_s, "run_id": config.run_id,
              "reward_kind": args.reward, "trainer_cpus": args.trainer_cpus,
              "requests": dict(counts), "rewards": rewards, "served_rewards": served,
              "trained_on": trained_on(settings.data_dir / "runs", config.run_id),
              "served_diff": bootstrap_mean_diff(served[versions[0]], served[versions[-1]], seed=args.seed).model_dump()
              if len(versions) > 1 else None,
              "reward_diff": bootstrap_mean_diff(first, last, seed=args.seed).model_dump() if rewards else None,
              "vs_start": compare(start, after, args.eval_datasets),
              "start": [r.model_dump() for r in start], "after": [r.model_dump() for r in after]}  # fmt: skip
    write_json_atomic(args.out / "results.json", result)
    (args.out / "results.md").write_text(report(result, args))
    print((args.out / "results.md").read_text())


def trained_on(runs_dir: Path, run_id: str) -> list[dict[str, int]]:
    """Per round, how many of its trajectories each policy version served (how stale the round's data was)."""
    return [dict(Counter(r.policy_version for r in records)) for records in round_records(runs_dir, run_id)]


def report(result: dict, args) -> str:
    counts = result["requests"]
    lines = [f"# Live learning ({result['elapsed_s'] / 60:.1f} min wall, live phase {result['live_s'] / 60:.1f} min)",
             "", f"`{result['command']}`", "",
             f"{args.clients} users asked training-pool questions of {args.train_dataset} at temperature "
             f"{args.serve_temperature} (sampled retrieval) and rewarded every answer ({args.reward}) through "
             "/v1/feedback while "
             f"`{args.algo}` trained {args.rounds} live rounds of {args.live_batch} trajectories and published into "
             "the same services" + (f" (trainer on cores {args.trainer_cpus}, vLLM on the rest)." if args.trainer_cpus
                                    else "."), "",
             f"Requests served: {counts.get('served', 0)}, failed: **{counts.get('failed', 0)}**; by version: "
             + ", ".join(f"{k.removeprefix('version ')} {v}" for k, v in sorted(counts.items())
                         if k.startswith("version ")), ""]  # fmt: skip
    means = [sum(r) / len(r) for r in result["rewards"] if r]
    lines.append("Reward per round (what each round trained on): " + ", ".join(f"{m:.3f}" for m in means))
    lines.append("Served by (per round): " + "; ".join(", ".join(f"{v} {n}" for v, n in r.items())
                                                     for r in result["trained_on"]))  # fmt: skip
    lines += ["", "Served reward by the policy version that answered (the online learning curve):", "",
              "| version | answers rewarded | mean reward |", "|---|---|---|"]  # fmt: skip
    lines += [f"| {v} | {len(r)} | {sum(r) / len(r):.3f} |" for v, r in result["served_rewards"].items() if r]
    if result["served_diff"]:
        d = result["served_diff"]
        lines.append(f"\nLast version (30+ answers) minus the first: {d['diff']:+.3f} "
                     f"[{d['low']:+.3f}, {d['high']:+.3f}] (bootstrap 95 %)")  # fmt: skip
    if result["reward_diff"]:
        d = result["reward_diff"]
        lines.append(f"Second half minus first half of the rounds: {d['diff']:+.3f} "
                     f"[{d['low']:+.3f}, {d['high']:+.3f}] (bootstrap 95 %)")  # fmt: skip
    lines += ["", "| scope | n | EM start -> after (sign) | F1 start -> after (sign) | recall@3 start -> after |",
              "|---|---|---|---|---|"]  # fmt: skip
    for scope, row in result["vs_start"].items():
        cells = []
        for metric in ("em", "f1", "recall"):
            m = row.get(metric)
            s = m and m["sign"]
            cells.append("–" if not m else f"{m['before']:.3f} -> {m['after']:.3f} (+{s['better']}/-{s['worse']}, "
                                           f"p={s['p']:.2g})")  # fmt: skip
        lines.append(f"| {scope} | {row['n']} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
