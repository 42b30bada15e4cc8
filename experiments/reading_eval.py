"""Issue 38's evaluation tables from `bridge-rl eval` result files: a policy's agent EM on every dataset against a
baseline's (paired per question), and the headroom table (`direct`, `agent`, and each oracle mode the files hold:
`oracle`, `oracle-search`) with its sign tests.

    python -m experiments.reading_eval --results NEW/agent/results.jsonl --results NEW/headroom/results.jsonl \
        --baseline docs/results/warmstart-9ds/results.jsonl.gz --out docs/results/reading-warmstart/eval
"""

from __future__ import annotations

import argparse
import gzip
import json
from collections import defaultdict
from pathlib import Path

from services.common.schemas.policy import ORACLE_MODES
from services.eval.stats import sign_test

OPEN_DOMAIN = ("nq", "triviaqa", "popqa", "hotpotqa", "2wikimultihopqa", "musique", "bamboogle")
HEADROOM = ("nq", "popqa", "hotpotqa", "2wikimultihopqa", "musique")


def read(path: Path) -> list[dict]:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt") as fh:
        return [json.loads(line) for line in fh if line.strip()]


def by_mode(rows: list[dict]) -> dict[str, dict[str, dict[str, dict]]]:
    """mode -> dataset -> question id -> row."""
    out: dict[str, dict[str, dict[str, dict]]] = defaultdict(lambda: defaultdict(dict))
    for row in rows:
        out[row["mode"]][row["dataset"]][row["id"]] = row
    return out


def mean(values: list[float]) -> float:
    return sum(values) / len(values) if values else float("nan")


def paired(a: dict[str, dict], b: dict[str, dict], key: str = "em") -> tuple[float, float, str]:
    ids = sorted(set(a) & set(b))
    test = sign_test([a[i][key] for i in ids], [b[i][key] for i in ids])
    return (
        mean([a[i][key] for i in ids]),
        mean([b[i][key] for i in ids]),
        f"+{test.better}/−{test.worse} (p = {test.p:.2g})",
    )


def agent_table(new: dict, old: dict) -> tuple[list[str], dict]:
    lines = [
        "| dataset (n) | answered | EM | F1 | baseline EM | new vs baseline, EM (sign test) |",
        "|---|---|---|---|---|---|",
    ]
    summary: dict[str, dict[str, float]] = {}
    for dataset in sorted(new, key=lambda d: (d not in OPEN_DOMAIN, d)):
        rows = new[dataset]
        answered = mean([float(bool(r["answer"])) for r in rows.values()])
        em, f1 = mean([r["em"] for r in rows.values()]), mean([r["f1"] for r in rows.values()])
        base_em, _, test = paired(old.get(dataset, {}), rows) if dataset in old else (float("nan"), 0.0, "")
        summary[dataset] = {"n": len(rows), "answered": answered, "em": em, "f1": f1, "baseline_em": base_em}
        lines.append(f"| {dataset} ({len(rows)}) | {answered:.2f} | {em:.3f} | {f1:.3f} | {base_em:.3f} | {test} |")
    for name, group in (("7 open-domain", OPEN_DOMAIN), ("all", tuple(summary))):
        kept = [d for d in group if d in summary]
        ids_new = {(d, i): r for d in kept for i, r in new[d].items()}
        ids_old = {(d, i): r for d in kept for i, r in old.get(d, {}).items()}
        shared = sorted(set(ids_new) & set(ids_old))
        test = sign_test([ids_old[k]["em"] for k in shared], [ids_new[k]["em"] for k in shared])
        em = mean([summary[d]["em"] for d in kept])
        base = mean([summary[d]["baseline_em"] for d in kept])
        summary[f"mean {name}"] = {"em": em, "baseline_em": base, "datasets": len(kept)}
        lines.append(f"| **mean, {name}** ({len(kept)} datasets) | | **{em:.3f}** | | {base:.3f} | "
                     f"+{test.better}/−{test.worse} (p = {test.p:.2g}), pooled |")  # fmt: skip
    return lines, summary


def headroom_table(modes: dict, oracle: str = "oracle") -> tuple[list[str], dict]:
    """`oracle`: which oracle mode's rows to set against `direct` and `agent` (`oracle` or `oracle-search`)."""
    lines = [
        f"| dataset | n | direct EM | agent EM | {oracle} EM | {oracle} vs direct | {oracle} vs agent |",
        "|---|---|---|---|---|---|---|",
    ]
    summary = {}
    for dataset in HEADROOM:
        rows = {m: modes.get(m, {}).get(dataset, {}) for m in ("direct", "agent", oracle)}
        if not rows[oracle]:
            continue
        direct, oracle_d, vs_direct = paired(rows["direct"], rows[oracle])
        agent, oracle_a, vs_agent = paired(rows["agent"], rows[oracle])
        summary[dataset] = {
            "direct": direct,
            "agent": agent,
            "oracle": oracle_a,
            "vs_direct": vs_direct,
            "vs_agent": vs_agent,
        }
        n = len(rows[oracle])
        lines.append(f"| {dataset} | {n} | {direct:.3f} | {agent:.3f} | {oracle_a:.3f} | {vs_direct} | {vs_agent} |")
    return lines, summary


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--results", type=Path, action="append", required=True, help="The new policy's results.jsonl")
    parser.add_argument("--baseline", type=Path, required=True, help="The baseline policy's agent results")
    parser.add_argument("--out", type=Path, required=True, help="Writes <out>.md and <out>.json")
    args = parser.parse_args()
    modes = by_mode([row for path in args.results for row in read(path)])
    old = by_mode(read(args.baseline))["agent"]
    agent_lines, agent_summary = agent_table(modes["agent"], old)
    sections, summary = ["## agent mode, every dataset", "", *agent_lines], {"agent": agent_summary}
    for oracle in [m for m in ORACLE_MODES if m in modes] or ["oracle"]:
        head_lines, head_summary = headroom_table(modes, oracle)
        name = "headroom" if oracle == "oracle" else f"headroom, {oracle}"
        sections += ["", f"## {name}", "", *head_lines]
        summary[name] = head_summary
    text = "\n".join(sections) + "\n"
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.with_suffix(".md").write_text(text)
    args.out.with_suffix(".json").write_text(json.dumps(summary, indent=1))
    print(text)


if __name__ == "__main__":
    main()
