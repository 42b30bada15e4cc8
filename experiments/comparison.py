"""Issue 29's pre-registered comparison, one resumable command per (arm, seed): BRIDGE against Search-R1 with the
training seed as the unit.

    python -m experiments.comparison run --arm bridge --seed 2 --config configs/comparison.toml \
        --data-dir .cache/comparison --qa-dir ../shared/data/qa --out runs/comparison/bridge-s2 [--resume]
    python -m experiments.comparison plan --seeds 0-3 --config configs/comparison.toml ...   # every command
    python -m experiments.comparison check --config configs/comparison.toml     # each arm's RunConfig, validated
    python -m experiments.collect_runs runs/comparison --out docs/results/comparison   # the table and plots

A run uses experiments/learning.py's machinery (the embedded stack: Redis, retriever, vLLM policy, a Celery
worker; `setup_run`, `evaluate`, `reset_to_base`, `run_rounds`): both services back on `base` (the merged warm
start and the base encoder), then `[run]` of the config with `algo.algo = <arm>` and `algo.seed = <seed>` (plus
the arm's `[arms.<arm>]` overrides). Every arm at a seed trains on the same questions in the same order: the
training pools of `train_datasets` are merged into one file (`<data-dir>/comparison-qa/comparison_train.jsonl`,
round-robin over the datasets, ids prefixed `<dataset>/`; its sha256 is in run.json) and the trainer draws a
round's questions from (seed, round) alone. The final checkpoint is evaluated on the evaluation split only (the
first `eval_questions` of each `eval_datasets` file): greedy (EM@1), `samples` sampled answers per question, and
the gold answer's log-probability under the checkpoint (services/eval/sampled.py, services/eval/logprob.py).

The run folder (`--out`) gets run.json (experiments.collect_runs.RunManifest), config.toml, metrics.jsonl,
rewards.json and eval/final/. `--resume` continues from whatever the folder and the trainer's run state hold:
training from `RunState.next_round` (as `bridge-rl train --resume`), then only the evaluation outputs missing.
One run at a time per `--data-dir` (the services' active versions are the data dir's).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shlex
import socket
import sys
import time
import tomllib
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from experiments.collect_runs import ARMS, MANIFEST, RunManifest
from services.data.split import EVAL_SPLIT
from services.trainer.config_file import merge, to_toml
from services.trainer.run_state import RunConfig

TRAIN_DATASET = "comparison"  # the merged pool: <data-dir>/comparison-qa/comparison_train.jsonl
REPO = Path(__file__).resolve().parents[1]
PLAN = "docs/preregistration.md"


def git_commit(path: str | None = None) -> str | None:
    """The checkout's HEAD, or the last commit that changed `path`; None outside a git checkout."""
    import subprocess

    command = ["git", "log", "-1", "--format=%H", *(["--", path] if path else [])]
    try:
        done = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=30, check=True)
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout.strip() or None


class ComparisonSettings(BaseModel):
    """`[comparison]` of the config: what the experiment adds to a training run."""

    model_config = ConfigDict(extra="forbid")

    arms: list[str] = Field(list(ARMS), description="The arms the plan lists; search-r1 is the baseline.")
    train_datasets: list[str] = Field(["2wikimultihopqa", "hotpotqa"], min_length=1)
    eval_datasets: list[str] = Field(["2wikimultihopqa", "hotpotqa"], min_length=1)
    eval_questions: int = Field(EVAL_SPLIT, ge=1, le=EVAL_SPLIT, description="First N of each: the evaluation split.")
    samples: int = Field(8, ge=0, le=64, description="Sampled answers per evaluation question (0: greedy only).")
    sample_temperature: float = Field(1.0, gt=0, le=5)
    sample_retrieval_temperature: float = Field(0.05, gt=0, description="As the rollouts' sampled retrieval.")
    logprob: bool = Field(True, description="Score log pi(y* | context) of the gold answer (in-process).")
    logprob_batch_size: int = Field(8, ge=1)
    max_new_tokens: int = Field(64, ge=8, description="BRIDGE_POLICY_MAX_NEW_TOKENS: tokens per turn.")
    adapter_serving: str = Field("merged", pattern="^(auto|lora|merged)$")


class ComparisonConfig(BaseModel):
    """The whole file: `[comparison]`, `[run]` (a RunConfig, shared by every arm) and `[arms.<arm>]` (dotted
    RunConfig keys that differ for one arm, e.g. `"algo.gamma" = 1.0`)."""

    model_config = ConfigDict(extra="forbid")

    comparison: ComparisonSettings = Field(default_factory=ComparisonSettings)
    run: dict[str, Any] = Field(default_factory=dict)
    arms: dict[str, dict[str, Any]] = Field(default_factory=dict)

    def run_config(self, arm: str, seed: int) -> RunConfig:
        """The arm's RunConfig at `seed`: `[run]`, its `[arms.<arm>]` overrides, then arm, seed, dataset, run id."""
        if arm not in ARMS:
            raise ValueError(f"unknown arm {arm!r}: one of {', '.join(ARMS)}")
        data = json.loads(json.dumps(self.run))  # a deep copy
        for key, value in self.arms.get(arm, {}).items():
            merge(data, key.split("."), value)
        for key, value in (("algo.algo", arm), ("algo.seed", seed), ("dataset", TRAIN_DATASET),
                           ("run_id", f"cmp-{arm}-s{seed}")):  # fmt: skip
            merge(data, key.split("."), value)
        return RunConfig.model_validate(data)


def load_config(path: Path) -> ComparisonConfig:
    config = ComparisonConfig.model_validate(tomllib.loads(path.read_text()))
    for arm in config.comparison.arms:
        config.run_config(arm, 0)  # every arm validates at load time, not after an hour of training
    return config


def parse_seeds(text: str) -> list[int]:
    """`0-3` -> [0, 1, 2, 3]; `0,2,5` -> [0, 2, 5]."""
    seeds: list[int] = []
    for part in text.split(","):
        lo, sep, hi = part.strip().partition("-")
        seeds += list(range(int(lo), int(hi) + 1)) if sep else [int(lo)]
    return seeds


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    for name in ("run", "plan", "check"):
        p = sub.add_parser(name)
        p.add_argument("--config", type=Path, default=Path("configs/comparison.toml"))
        if name == "check":
            continue
        p.add_argument("--data-dir", type=Path, default=Path(".cache/comparison"), help="Models, index, runs.")
        p.add_argument("--qa-dir", type=Path, default=Path("../shared/data/qa"), help="<dataset>.jsonl files.")
        p.add_argument("--corpus", type=Path, nargs="*", default=[], help="Corpus JSONL files to ingest first.")
        p.add_argument("--policy-port", type=int, default=8600)
        if name == "run":
            p.add_argument("--arm", choices=ARMS, required=True)
            p.add_argument("--seed", type=int, required=True)
            p.add_argument("--out", type=Path, required=True, help="The run folder (run.json and outputs).")
            p.add_argument("--resume", action="store_true", help="Continue the run of --out where it stopped.")
        else:
            p.add_argument("--seeds", type=parse_seeds, default=parse_seeds("0-3"))
            p.add_argument("--runs", type=Path, default=Path("runs/comparison"), help="Run folders go under it.")
    return parser


def plan(args: argparse.Namespace, config: ComparisonConfig) -> list[str]:
    """One command per (seed, arm), seed-major (a session that stops early leaves whole seeds)."""
    extra = ["--data-dir", str(args.data_dir), "--qa-dir", str(args.qa_dir)]
    if args.corpus:
        extra += ["--corpus", *map(str, args.corpus)]
    return [shlex.join(["python", "-m", "experiments.comparison", "run", "--arm", arm, "--seed", str(seed),
                        "--config", str(args.config), *extra, "--out", str(args.runs / f"{arm}-s{seed}"),
                        "--resume"])
            for seed in args.seeds for arm in config.comparison.arms]  # fmt: skip


def merged_training_pool(qa_dir: Path, datasets: list[str], out_dir: Path) -> tuple[Path, str]:
    """The training pools of `datasets` (never their evaluation splits) as one `<TRAIN_DATASET>_train.jsonl`,
    round-robin over the datasets, ids prefixed with the dataset; returns (its folder, its sha256)."""
    from services.data.split import training_rows

    pools = [[{**row, "id": f"{d}/{row['id']}", "dataset": d} for _, row in training_rows(qa_dir, d)]
             for d in datasets]  # fmt: skip
    rows = [pool[i] for i in range(max(map(len, pools))) for pool in pools if i < len(pool)]
    text = "".join(json.dumps(row, sort_keys=True) + "\n" for row in rows)
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"{TRAIN_DATASET}_train.jsonl"
    if not path.exists() or path.read_text() != text:
        tmp = path.with_suffix(".tmp")
        tmp.write_text(text)
        tmp.replace(path)
    return out_dir, hashlib.sha256(text.encode()).hexdigest()


def save_manifest(out: Path, manifest: RunManifest) -> None:
    from services.common.checkpoints import write_json_atomic

    write_json_atomic(out / MANIFEST, manifest.model_dump(mode="json"))


def train_or_resume(stack, run_config: RunConfig, resume: bool):
    """Start the run (services back on base first), or continue it from RunState.next_round as `bridge-rl train
    --resume` does; returns the final RunState."""
    from tqdm import tqdm

    from experiments.compare_algos import reset_to_base, run_rounds
    from services.trainer.run_state import RunState
    from services.trainer.settings import TrainerSettings
    from services.trainer.submit import enqueue, follow

    settings = TrainerSettings(data_dir=stack.settings.data_dir, redis_url=stack.redis_url,
                               policy_url=stack.policy_url, retriever_url=stack.retriever_url)  # fmt: skip
    path = RunState.path(settings.runs_dir, run_config.run_id)
    if not path.exists():
        reset_to_base(stack)
        run_rounds(stack, run_config)
        return RunState.load(settings.runs_dir, run_config.run_id)
    if not resume:
        raise SystemExit(f"{path} exists: pass --resume to continue it (or use another --data-dir)")
    state = RunState.load(settings.runs_dir, run_config.run_id)
    if state.config != run_config:
        raise SystemExit(f"{path} was started with another config: {state.config} (now {run_config})")
    if state.status != "done":
        state.status, state.error = "running", None
        state.save(settings.runs_dir)
        enqueue(settings, run_config.run_id, state.next_round)
        with tqdm(total=run_config.rounds, initial=state.next_round, desc=f"train {run_config.algo.algo}") as bar:
            state = follow(settings, run_config.run_id, lambda d: d > bar.n and bar.update(d - bar.n), poll_s=2.0)
    if state.status == "failed":
        raise RuntimeError(f"{run_config.run_id}: training failed: {state.error} (fix, then --resume)")
    return state


def evaluate_final(stack, state, items, settings: ComparisonSettings, eval_dir: Path, seed: int) -> dict:
    """Greedy, sampled and log-prob evaluation of the run's final versions (pinned while it runs); each output is
    skipped when already there, so a resumed run redoes only what is missing."""
    from experiments.learning import evaluate
    from services.common.clients.policy import PolicyClient
    from services.common.clients.retriever import RetrieverClient
    from services.eval.logprob import AnswerLogprob, answer_logprobs, inputs_from_records, load_policy
    from services.eval.pinning import pinned
    from services.eval.report import read_results, write_report
    from services.eval.sampled import write_sampled
    from services.trainer.settings import TrainerSettings

    eval_dir.mkdir(parents=True, exist_ok=True)
    token = stack.settings.resolve_admin_token()
    max_turns = state.config.max_turns
    with (
        RetrieverClient(stack.retriever_url, admin_token=token, timeout=600) as retriever,
        PolicyClient(stack.policy_url, admin_token=token, timeout=600) as policy,
        pinned([(retriever, state.retriever_version), (policy, state.policy_version)]),
    ):
        results_path = eval_dir / "results.jsonl"
        greedy = read_results(results_path)
        if len(greedy) != len(items) or any(r.error for r in greedy):
            greedy = evaluate(stack, items, max_turns)
            results_path.write_text("".join(r.model_dump_json() + "\n" for r in greedy))
            write_report(eval_dir, greedy, {"datasets": settings.eval_datasets, "limit": settings.eval_questions,
                                            "max_turns": max_turns, "top_k": state.config.top_k}, 3)  # fmt: skip
        trajectories = eval_dir / "trajectories.jsonl"
        if not trajectories.exists():
            lines = [json.dumps({"dataset": r.dataset, "record": policy.trajectory(r.trajectory_id).model_dump()})
                     for r in greedy if r.trajectory_id]  # fmt: skip
            trajectories.write_text("".join(line + "\n" for line in lines))
        logprob_path, logprobs = eval_dir / "logprob.jsonl", None
        if settings.logprob:
            if not logprob_path.exists():
                from services.eval.logprob import read_trajectories

                trainer = TrainerSettings()
                loaded = load_policy(trainer.base_policy_dir, state.policy_adapter and Path(state.policy_adapter))
                rows = inputs_from_records(read_trajectories(trajectories), loaded[0])
                scored = answer_logprobs(None, rows, batch_size=settings.logprob_batch_size, policy=loaded)
                logprob_path.write_text("".join(r.model_dump_json() + "\n" for r in scored))
                del loaded
            logprobs = [AnswerLogprob.model_validate_json(x) for x in logprob_path.read_text().splitlines() if x]
        if settings.samples and (eval_dir / "sampled.json").exists():
            return json.loads((eval_dir / "sampled.json").read_text())["scopes"]
        return write_sampled(eval_dir, policy, greedy, items if settings.samples else [], logprobs,
                             samples=max(settings.samples, 1), temperature=settings.sample_temperature,
                             retrieval_temperature=settings.sample_retrieval_temperature, seed=seed,
                             max_turns=max_turns, top_k=state.config.top_k)  # fmt: skip


def run(args: argparse.Namespace, config: ComparisonConfig) -> RunManifest:
    from experiments.learning import round_rewards, setup_run
    from services.cli.ingest import ingest_file
    from services.cli.launcher import Stack
    from services.cli.prepare import prepare_all
    from services.common.checkpoints import write_json_atomic
    from services.common.clients.retriever import RetrieverClient
    from services.common.settings import CommonSettings
    from services.data.datasets import load_items

    settings = config.comparison
    run_config = config.run_config(args.arm, args.seed)
    out: Path = args.out
    manifest_path = out / MANIFEST
    if manifest_path.exists() and not args.resume:
        raise SystemExit(f"{manifest_path} exists: pass --resume to continue that run")
    previous = RunManifest.model_validate_json(manifest_path.read_text()) if manifest_path.exists() else None
    if previous is not None and (previous.arm, previous.seed) != (args.arm, args.seed):
        raise SystemExit(f"{out} holds {previous.arm} seed {previous.seed}, not {args.arm} seed {args.seed}")
    if previous is not None and previous.status == "done":
        print(f"{out}: done already ({previous.run_id})")
        return previous
    # setup_run's fields (learning.add_run_args): here from the config
    args.eval_questions, args.max_new_tokens = settings.eval_questions, settings.max_new_tokens
    args.adapter_serving, args.vllm_port = settings.adapter_serving, args.policy_port + 11
    command = setup_run(argparse.ArgumentParser(), args, "experiments.comparison")
    qa_folder, pool_sha = merged_training_pool(args.qa_dir, settings.train_datasets, args.data_dir / "comparison-qa")
    os.environ["BRIDGE_TRAINER_QA_DIR"] = str(qa_folder.resolve())  # the merged pool; evaluation reads --qa-dir
    manifest = previous or RunManifest(arm=args.arm, seed=args.seed, run_id=run_config.run_id, command=command,
                                       code_commit=git_commit(), preregistration_commit=git_commit(PLAN))  # fmt: skip
    if manifest.train_questions_sha256 not in (None, pool_sha):
        raise SystemExit(f"the training pool changed since this run started ({manifest.train_questions_sha256})")
    manifest.train_questions_sha256 = pool_sha
    (out / "config.toml").write_text(to_toml(run_config))
    save_manifest(out, manifest)
    items = [i for d in settings.eval_datasets for i in load_items(args.qa_dir, d, settings.eval_questions)]
    started = time.time()
    common = CommonSettings()
    prepare_all(common)
    try:
        with Stack(common, policy_port=args.policy_port, retriever_port=args.policy_port + 1,
                   console_port=args.policy_port + 2) as stack:  # fmt: skip
            with RetrieverClient(stack.retriever_url, admin_token=common.resolve_admin_token(), timeout=600) as c:
                for corpus in args.corpus:
                    print(ingest_file(c, corpus), flush=True)
            state = train_or_resume(stack, run_config, args.resume)
            runs_dir = common.data_dir / "runs"
            metrics = runs_dir / run_config.run_id / "metrics.jsonl"
            (out / manifest.metrics).write_text(metrics.read_text() if metrics.exists() else "")
            write_json_atomic(out / "rewards.json", round_rewards(runs_dir, run_config.run_id))
            manifest.status = "evaluating"
            manifest.versions = {"policy": state.policy_version, "retriever": state.retriever_version}
            save_manifest(out, manifest)
            means = evaluate_final(stack, state, items, settings, out / "eval" / "final", args.seed)
            manifest.eval_dirs["final"] = "eval/final"
            manifest.status = "done"
    finally:
        elapsed = time.time() - started
        manifest.wall_s += elapsed
        manifest.sessions.append({"host": socket.gethostname(), "started": started, "wall_s": elapsed,
                                  "argv": sys.argv[1:], "status": manifest.status})  # fmt: skip
        save_manifest(out, manifest)
    print(json.dumps({"run": str(out), **means.get("all", {})}, indent=1))
    return manifest


def main(argv: list[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    config = load_config(args.config)
    if args.command == "check":
        for arm in config.comparison.arms:
            print(f"# arm {arm}, seed 0\n{to_toml(config.run_config(arm, 0))}")
    elif args.command == "plan":
        print("\n".join(plan(args, config)))
    else:
        run(args, config)


if __name__ == "__main__":
    main()
