"""Merge comparison runs (issue 29) from any session into one table and plots, with the seed as the unit.

Each run folder (what `python -m experiments.comparison run` writes, wherever it ran) holds:

    run.json        RunManifest: arm, seed, run_id, command, status, wall_s, eval_dirs {name: relative path}
    config.toml     the run's RunConfig (as `bridge-rl train --config` reads it)
    metrics.jsonl   one row per round (reward/mean, em/mean, ...), the trainer's own
    eval/<name>/    questions.jsonl (one QuestionScore per question: greedy EM/F1, mean EM/F1 over K samples,
                    the gold answer's log-prob), results.jsonl, samples.jsonl, logprob.jsonl, ...

`collect_runs` finds every run.json under the given roots, pairs each arm's seeds with search-r1's at the same
seed (the same warm start and training questions), and reports per arm: per-seed mean difference over evaluation
questions (with a question-bootstrap interval), the one-sample t-test and exact sign test across seeds for the
PRIMARY metric, and the same tests for the secondary metrics with Benjamini–Hochberg adjusted p-values.

    python -m experiments.collect_runs runs/comparison ../other-session/runs/comparison --out docs/results/comparison
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Iterable, Sequence
from pathlib import Path

from pydantic import BaseModel, Field

from services.common.checkpoints import write_json_atomic
from services.eval.stats import (
    benjamini_hochberg,
    bootstrap_questions,
    one_sample_t_test,
    seed_differences,
    seed_sign_test,
)

BASELINE = "search-r1"
ARMS = ("search-r1", "bridge", "alt-rp", "alt-pr")
PRIMARY = "em_greedy"  # pre-registered (docs/preregistration.md): greedy agent EM on the evaluation split
SECONDARY = ("em_sampled", "f1_greedy", "f1_sampled", "logprob")
MANIFEST = "run.json"


class RunManifest(BaseModel):
    """run.json: what one comparison run is and where its outputs lie (paths relative to the run folder)."""

    arm: str
    seed: int
    run_id: str
    command: str
    status: str = Field("training", description="training, evaluating or done.")
    wall_s: float = Field(0.0, description="Wall time over every session that worked on the run.")
    config: str = "config.toml"
    metrics: str = "metrics.jsonl"
    eval_dirs: dict[str, str] = Field(default_factory=dict, description="name -> folder; `final` is compared.")
    train_questions_sha256: str | None = Field(None, description="Of the merged training pool: same for all arms.")
    versions: dict[str, str | None] = Field(default_factory=dict, description="The final policy/retriever.")
    sessions: list[dict] = Field(default_factory=list, description="One entry per invocation: host, start, wall.")
    code_commit: str | None = Field(None, description="The checkout's commit when the run started.")
    preregistration_commit: str | None = Field(
        None, description="The last commit of docs/preregistration.md when the run started: the plan it runs under."
    )


class Run(BaseModel):
    folder: Path
    manifest: RunManifest
    rewards: list[float]  # reward/mean per round
    questions: dict[str, dict[str, float]]  # metric -> "dataset/id" -> value (the final evaluation)


def find_runs(roots: Iterable[Path]) -> list[Path]:
    return sorted({path.parent for root in roots for path in Path(root).rglob(MANIFEST)})


def load_run(folder: Path, eval_name: str = "final") -> Run:
    manifest = RunManifest.model_validate_json((folder / MANIFEST).read_text())
    metrics = folder / manifest.metrics
    rows = [json.loads(line) for line in metrics.read_text().splitlines() if line.strip()] if metrics.exists() else []
    rewards = [row["reward/mean"] for row in sorted(rows, key=lambda r: r["round"])]
    questions: dict[str, dict[str, float]] = {}
    if eval_name in manifest.eval_dirs:
        path = folder / manifest.eval_dirs[eval_name] / "questions.jsonl"
        for row in map(json.loads, path.read_text().splitlines() if path.exists() else []):
            for metric in (PRIMARY, *SECONDARY):
                if row.get(metric) is not None:
                    questions.setdefault(metric, {})[f"{row['dataset']}/{row['id']}"] = row[metric]
    return Run(folder=folder, manifest=manifest, rewards=rewards, questions=questions)


def by_arm(runs: Sequence[Run]) -> dict[str, dict[int, Run]]:
    """arm -> seed -> run; a seed run twice (two sessions) keeps the one that finished, else the later folder."""
    out: dict[str, dict[int, Run]] = {}
    for run in sorted(runs, key=lambda r: (r.manifest.status == "done", str(r.folder))):
        out.setdefault(run.manifest.arm, {})[run.manifest.seed] = run
    return out


def metric_by_seed(runs: dict[int, Run], metric: str) -> dict[int, dict[str, float]]:
    return {seed: run.questions.get(metric, {}) for seed, run in runs.items() if run.questions.get(metric)}


def compare_arm(arm_runs: dict[int, Run], base_runs: dict[int, Run], metric: str, seed: int = 0) -> dict:
    """The per-seed paired differences of one metric (arm - search-r1), their question-bootstrap intervals, and
    the across-seed tests (t-test needs two seeds; sign test one)."""
    arm_q, base_q = metric_by_seed(arm_runs, metric), metric_by_seed(base_runs, metric)
    diffs = seed_differences(arm_q, base_q)
    per_seed = {}
    for s in diffs:
        shared = sorted(set(arm_q[s]) & set(base_q[s]))
        interval = bootstrap_questions([[arm_q[s][q] - base_q[s][q]] for q in shared], n=2000, seed=seed)
        per_seed[s] = {"diff": diffs[s], "low": interval.low, "high": interval.high, "questions": len(shared)}
    values = [diffs[s] for s in sorted(diffs)]
    out: dict = {"metric": metric, "seeds": sorted(diffs), "per_seed": per_seed}
    if values:
        out["sign"] = seed_sign_test(values).model_dump()
    if len(values) >= 2:
        out["t"] = one_sample_t_test(values).model_dump()
    return out


def analyse(runs: Sequence[Run]) -> dict:
    """Every arm against search-r1: the primary test, and the secondary ones with BH-adjusted p (over every arm
    and secondary metric together; the t-test's p, else the sign test's)."""
    arms = by_arm(runs)
    base = arms.get(BASELINE, {})
    out: dict = {"arms": {a: sorted(r) for a, r in arms.items()}, "primary": PRIMARY, "comparisons": {}}
    secondary_ps: list[tuple[str, str, float]] = []
    for arm, arm_runs in arms.items():
        if arm == BASELINE:
            continue
        entry = {metric: compare_arm(arm_runs, base, metric) for metric in (PRIMARY, *SECONDARY)}
        out["comparisons"][arm] = entry
        for metric in SECONDARY:
            test = entry[metric].get("t") or entry[metric].get("sign")
            if test:
                secondary_ps.append((arm, metric, test["p"]))
    for (arm, metric, _), q in zip(secondary_ps, benjamini_hochberg([p for *_, p in secondary_ps]), strict=True):
        out["comparisons"][arm][metric]["q_bh"] = q
    return out


def _mean(values: Sequence[float]) -> float | None:
    return sum(values) / len(values) if values else None


def _fmt(value: float | None, spec: str = ".3f") -> str:
    return "–" if value is None else format(value, spec)


def table(runs: Sequence[Run], analysis: dict) -> str:
    arms = by_arm(runs)
    lines = ["## Runs", "", "| arm | seed | status | rounds | mean reward | EM@1 greedy | EM sampled | F1 greedy | "
             "log p(y*) | wall h | folder |", "|---|---|---|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for arm in sorted(arms, key=lambda a: (ARMS.index(a) if a in ARMS else len(ARMS), a)):
        for seed, run in sorted(arms[arm].items()):
            m = {k: _mean(list(v.values())) for k, v in run.questions.items()}
            lines.append(f"| {arm} | {seed} | {run.manifest.status} | {len(run.rewards)} | "
                         f"{_fmt(_mean(run.rewards))} | {_fmt(m.get('em_greedy'))} | {_fmt(m.get(PRIMARY))} | "
                         f"{_fmt(m.get('f1_greedy'))} | {_fmt(m.get('logprob'), '.2f')} | "
                         f"{run.manifest.wall_s / 3600:.2f} | {run.folder} |")  # fmt: skip
    lines += ["", f"## Against {BASELINE}, the seed as the unit", "",
              f"Primary (pre-registered): {PRIMARY}. Per seed: mean over evaluation questions of arm - {BASELINE} "
              "(question-bootstrap 95 %); across seeds: one-sample t-test and exact sign test. Secondary metrics: "
              "Benjamini–Hochberg q over every arm and secondary metric.", "",
              "| arm | metric | seeds | per-seed difference [95 %] | mean (t 95 %) | t-test p | sign test | BH q |",
              "|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for arm, entry in analysis["comparisons"].items():
        for metric, c in entry.items():
            seeds = "; ".join(f"s{s} {d['diff']:+.3f} [{d['low']:+.3f}, {d['high']:+.3f}]"
                              for s, d in sorted(c["per_seed"].items()))  # fmt: skip
            t, sign = c.get("t"), c.get("sign")
            mean = f"{t['mean']:+.3f} [{t['low']:+.3f}, {t['high']:+.3f}]" if t else "–"
            signs = f"+{sign['better']}/-{sign['worse']}, p={sign['p']:.2g}" if sign else "–"
            name = f"**{metric}**" if metric == PRIMARY else metric
            lines.append(f"| {arm} | {name} | {len(c['seeds'])} | {seeds or '–'} | {mean} | "
                         f"{_fmt(t and t['p'], '.3g')} | {signs} | {_fmt(c.get('q_bh'), '.3g')} |")  # fmt: skip
    return "\n".join(lines) + "\n"


def plot(out: Path, runs: Sequence[Run], analysis: dict) -> list[Path]:
    """reward per round (mean over seeds, band min..max over seeds, per arm); the primary metric per seed per arm;
    the primary test's per-seed differences against search-r1 with the t interval."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    arms = by_arm(runs)
    paths = []
    fig, ax = plt.subplots(figsize=(6.5, 3.8))
    for arm, seeds in arms.items():
        curves = [r.rewards for r in seeds.values() if r.rewards]
        if not curves:
            continue
        length = min(len(c) for c in curves)
        rounds = list(range(length))
        columns = [[c[i] for c in curves] for i in rounds]
        line = ax.plot(rounds, [sum(col) / len(col) for col in columns], label=f"{arm} ({len(curves)} seeds)")
        ax.fill_between(rounds, [min(col) for col in columns], [max(col) for col in columns],
                        color=line[0].get_color(), alpha=0.2)  # fmt: skip
    ax.set(xlabel="round", ylabel="training reward (mean per round)", title="reward per round, band: min-max seeds")
    ax.legend(fontsize=8)
    fig.tight_layout()
    paths.append(out / "reward_per_round.png")
    fig.savefig(paths[-1], dpi=120)
    plt.close(fig)

    fig, ax = plt.subplots(figsize=(6.5, 3.8))
    names = list(arms)
    for x, arm in enumerate(names):
        for seed, run in sorted(arms[arm].items()):
            values = list(run.questions.get(PRIMARY, {}).values())
            if values:
                ax.scatter([x], [sum(values) / len(values)], color="C0")
                ax.annotate(f"s{seed}", (x, sum(values) / len(values)), fontsize=7, xytext=(4, 0),
                            textcoords="offset points")  # fmt: skip
    ax.set_xticks(range(len(names)), names)
    ax.set(ylabel=PRIMARY, title=f"evaluation {PRIMARY} per seed")
    fig.tight_layout()
    paths.append(out / "eval_per_seed.png")
    fig.savefig(paths[-1], dpi=120)
    plt.close(fig)

    fig, ax = plt.subplots(figsize=(6.5, 3.8))
    ax.axhline(0, color="grey", lw=0.8)
    for x, entry in enumerate(analysis["comparisons"].values()):
        c = entry[PRIMARY]
        diffs = [d["diff"] for _, d in sorted(c["per_seed"].items())]
        ax.scatter([x] * len(diffs), diffs, color="C1", zorder=3)
        if c.get("t"):
            t = c["t"]
            ax.errorbar([x + 0.15], [t["mean"]], yerr=[[t["mean"] - t["low"]], [t["high"] - t["mean"]]], fmt="s",
                        color="k", capsize=4)  # fmt: skip
            ax.annotate(f"p={t['p']:.2g}", (x + 0.2, t["mean"]), fontsize=7)
    ax.set_xticks(range(len(analysis["comparisons"])), list(analysis["comparisons"]))
    ax.set(ylabel=f"{PRIMARY}: arm - {BASELINE}", title="primary test: per-seed differences, t interval")
    fig.tight_layout()
    paths.append(out / "primary_test.png")
    fig.savefig(paths[-1], dpi=120)
    plt.close(fig)
    return paths


def collect(roots: Sequence[Path], out: Path) -> dict:
    runs = [load_run(folder) for folder in find_runs(roots)]
    analysis = analyse(runs)
    out.mkdir(parents=True, exist_ok=True)
    images = plot(out, runs, analysis)
    text = "# Comparison runs, merged\n\n" + table(runs, analysis)
    text += "\n" + "\n".join(f"![{p.stem}]({p.name})" for p in images) + "\n"
    (out / "results.md").write_text(text)
    write_json_atomic(out / "results.json", {"runs": [str(r.folder) for r in runs], **analysis})
    return analysis


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("roots", type=Path, nargs="+", help="Folders searched for run.json (any depth).")
    parser.add_argument("--out", type=Path, default=Path("docs/results/comparison"))
    args = parser.parse_args()
    collect(args.roots, args.out)
    print((args.out / "results.md").read_text())


if __name__ == "__main__":
    main()
