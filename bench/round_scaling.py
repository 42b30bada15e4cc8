"""How a training round's time and memory grow with questions x group size, and with the Q subsample.

One set of rollouts (the largest shape: `--questions` demo hotpotqa questions x `--group` rollouts, real SmolLM2
samples as in bench/train_round.py) is built once; smaller shapes take its first questions and first rollouts,
so every row trains on a prefix of the same data. Each row is one round in a fresh process
(`bench.train_round --one`), so its peak memory is its own.

  - shapes: `search-r1` and `bridge` (the paper's estimator, the configured Q subsample) at each
    questions x group in `--shapes`;
  - Q subsample: `bridge` at the largest shape with `q_steps` (search steps Q_theta scores, each with
    `q_candidates` = 5 candidates) from `--q-steps`.

    python -m bench.round_scaling [--shapes 4x2 4x4 8x4 16x4] [--q-steps 2 8 16] [--repeat 3]

Every row runs `--repeat` times (default 3, long: see --help). Writes the rows of every repeat to `--out` (JSON)
and a two-panel plot of their medians beside it (`.png`); each ratio's repeats, median and spread, with the CPU,
go to `--json` (docs/results/bench/round_scaling.json, which `python -m tools.perf_table --write` reads).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from bench.repeat import Ratios, add_repeat_arguments, command_line, finish, median_rows, repeat
from bench.script import REPO, prepare_models, run_module, script_parser
from bench.train_round import make_batch_file
from services.trainer.algo.config import AlgoConfig


def shape(text: str) -> tuple[int, int]:
    questions, group = text.lower().split("x")
    return int(questions), int(group)


def subset_batch(full: dict, questions: int, group: int) -> dict:
    """The first `questions` questions' first `group` rollouts, and only the documents they retrieved from."""
    item_ids = list(dict.fromkeys(r["item_id"] for r in full["records"]))[:questions]
    records = [r for r in full["records"] if r["item_id"] in item_ids and r["group_index"] < group]
    wanted = {str(c["id"]) for r in records for t in r["turns"] if t["search"] for c in t["search"]["candidates"]}
    return {"records": records, "docs": {k: v for k, v in full["docs"].items() if k in wanted}}


def round_row(row: str, batch: Path, work: Path, q_steps: int | None = None) -> dict:
    args = ["--one", row, "--batch", str(batch), "--work", str(work)]
    out = run_module("bench.train_round", *args, *(["--q-steps", str(q_steps)] if q_steps else []))
    return json.loads(out.strip().splitlines()[-1])


def plot(rows: list[dict], out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4))
    for algo, marker in (("search-r1", "o"), ("bridge", "s")):
        points = sorted((r["trajectories"], r["seconds"]) for r in rows if r["kind"] == "shape" and r["row"] == algo)
        left.plot(*zip(*points, strict=True), marker=marker, label=algo)
    left.set(xlabel="trajectories per round (questions x G)", ylabel="round seconds", title="round time vs batch")
    left.legend()
    points = sorted((r["q_samples"], r["seconds"]) for r in rows if r["kind"] == "q")
    right.plot(*zip(*points, strict=True), marker="s", color="C1", label="bridge")
    largest = max((r for r in rows if r["row"] == "search-r1"), key=lambda r: r["trajectories"], default=None)
    if largest:  # the same batch without Q_theta or the retriever step: what the Q subsample adds to
        right.axhline(largest["seconds"], color="C0", linestyle="--", label=f"search-r1 ({largest['shape']})")
    right.set_ylim(bottom=0)
    right.legend()
    right.set(xlabel="Q subsample (search steps scored by Q_theta)", ylabel="bridge round seconds",
              title="bridge round time vs Q subsample")  # fmt: skip
    fig.tight_layout()
    fig.savefig(out)


def measure_shapes(args: argparse.Namespace, full: dict, batches: Path, index: int, rows: list[dict]) -> Ratios:
    """One repetition: every shape's two rounds and the Q-subsample rounds, printed as a table; appends the rows
    and returns the ratios."""
    most_q, most_g = max(q for q, _ in args.shapes), max(g for _, g in args.shapes)
    these, by_shape = [], {}
    print(f"{'kind':6} {'row':10} {'shape':>6} {'traj':>5} {'q_steps':>7} {'Q samples':>9} {'seconds':>8} "
          f"{'peak MB':>8} {'over load MB':>12}", flush=True)  # fmt: skip

    def record(kind: str, row: str, q: int, g: int, q_steps: int | None = None) -> None:
        batch = batches / f"{q}x{g}.json"
        batch.write_text(json.dumps(subset_batch(full, q, g)))
        r = round_row(row, batch, args.work, q_steps) | {"kind": kind, "shape": f"{q}x{g}", "trajectories": q * g,
                                                         "q_steps": q_steps, "repeat": index}  # fmt: skip
        these.append(r)
        if kind == "shape":
            by_shape[(row, q, g)] = r
        over = r["peak_mb"] - r["loaded_mb"]
        print(f"{kind:6} {row:10} {r['shape']:>6} {q * g:>5} {q_steps or '-':>7} {r['q_samples']:>9} "
              f"{r['seconds']:>8.1f} {r['peak_mb']:>8.0f} {over:>12.0f}", flush=True)  # fmt: skip

    for q, g in args.shapes:
        for row in ("search-r1", "bridge"):
            record("shape", row, q, g)
    default_q = AlgoConfig().q_steps
    for q_steps in args.q_steps:
        if q_steps == default_q and (most_q, most_g) in args.shapes:  # that round already ran as a shape row
            these.append(by_shape[("bridge", most_q, most_g)] | {"kind": "q", "q_steps": q_steps})
            continue
        record("q", "bridge", most_q, most_g, q_steps)

    print()
    ratios = {}
    for q, g in args.shapes:
        ratio = by_shape[("bridge", q, g)]["seconds"] / by_shape[("search-r1", q, g)]["seconds"]
        ratios[f"seconds/bridge_over_search-r1@{q}x{g}"] = ratio
        print(f"bridge round time ratio bridge/search-r1 at {q}x{g}: {ratio:.2f}x")
    first, last = args.shapes[0], args.shapes[-1]
    for algo in ("search-r1", "bridge"):
        a, b = by_shape[(algo, *first)], by_shape[(algo, *last)]
        growth = (b["seconds"] / a["seconds"]) / (b["trajectories"] / a["trajectories"])
        ratios[f"seconds_per_trajectory/{algo}@{b['shape']}_over_{a['shape']}"] = growth
        print(f"{a['row']} seconds per trajectory, {b['shape']} vs {a['shape']}: {growth:.2f}x")
    q_rows = [r for r in these if r["kind"] == "q"]
    if len(q_rows) > 1:
        extra = max(1, q_rows[-1]["q_samples"] - q_rows[0]["q_samples"])
        per_q = (q_rows[-1]["seconds"] - q_rows[0]["seconds"]) / extra
        ratios[f"bridge_per_extra_q_sample@{most_q}x{most_g}_s"] = per_q
        print(f"bridge seconds per extra Q sample at {most_q}x{most_g}: {per_q:.2f} s")
    rows.extend(these)
    return ratios


def main(argv: list[str] | None = None) -> None:
    parser = script_parser(__doc__, out=REPO / "docs" / "results" / "round-scaling.json")
    parser.add_argument("--shapes", type=shape, nargs="+", default=[(4, 2), (4, 4), (8, 4), (16, 4)],
                        help="questions x group size, e.g. 8x4.")  # fmt: skip
    parser.add_argument("--q-steps", type=int, nargs="+", default=[2, 8, 16],
                        help="Q subsample sizes for bridge at the largest shape.")  # fmt: skip
    add_repeat_arguments(parser, "round_scaling", cost="Long: one repetition of the default rows (10 rounds) is "
                         "~27 min on a quiet 2-core AMX machine, so the default 3 take ~1.5 h (plus ~4 min building "
                         "the rollouts once); --shapes 4x2 8x4 --q-steps 8 is ~6 min a repetition.")  # fmt: skip
    args = parser.parse_args(argv)
    started = time.perf_counter()
    models = prepare_models(args.work)
    most_q, most_g = max(q for q, _ in args.shapes), max(g for _, g in args.shapes)
    batches = args.work / "round-scaling"
    batches.mkdir(parents=True, exist_ok=True)
    full_file = batches / f"rollouts-{most_q}x{most_g}.json"
    if not full_file.exists():  # the rollouts are the slow part to build; every shape reads a prefix of them
        make_batch_file(models, full_file, questions=most_q, group=most_g)
    full = json.loads(full_file.read_text())

    rows: list[dict] = []
    runs = repeat(lambda index: measure_shapes(args, full, batches, index, rows), args.repeat)
    wall = time.perf_counter() - started
    print(f"wall: {wall:.0f} s")
    context = {"shapes": [f"{q}x{g}" for q, g in args.shapes], "q_steps": args.q_steps}
    finish("round_scaling", args, runs, started, context=context, argv=argv)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    command = command_line("round_scaling", argv)
    args.out.write_text(json.dumps({"command": command, "wall_s": wall, "repeat": args.repeat, "rows": rows},
                                   indent=1))  # fmt: skip
    plot(median_rows(rows, ("kind", "row", "shape", "q_steps"), ("seconds",)), args.out.with_suffix(".png"))


if __name__ == "__main__":
    main()
