"""summary.json and summary.md of an evaluation run."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

from services.common.checkpoints import write_json_atomic
from services.eval.scoring import ItemResult, Summary, group_means, summarize


def _fmt(value: float | None, digits: int = 3) -> str:
    return "–" if value is None else f"{value:.{digits}f}"


def markdown(rows: Sequence[Summary], groups: Sequence[dict], top_k: int) -> str:
    lines = [
        f"| dataset | group | mode | n | EM | F1 | cover | recall@{top_k} | searches/q | answered | p50 s | p95 s "
        "| errors |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r.dataset} | {r.group} | {r.mode} | {r.n} | {_fmt(r.em)} | {_fmt(r.f1)} | {_fmt(r.cover)} | "
            f"{_fmt(r.recall)} | "
            f"{r.searches:.2f} | {r.answered:.2f} | {_fmt(r.latency_p50_s, 1)} | {_fmt(r.latency_p95_s, 1)} | "
            f"{r.errors} |"
        )
    lines += ["", "| group | mode | datasets | EM | F1 | cover | recall |", "|---|---|---|---|---|---|---|"]
    for g in groups:
        scores = " | ".join(_fmt(g[k]) for k in ("em", "f1", "cover", "recall"))
        lines.append(f"| {g['group']} | {g['mode']} | {g['datasets']} | {scores} |")
    return "\n".join(lines) + "\n"


def read_results(path: Path) -> list[ItemResult]:
    """What an earlier (possibly killed) run wrote; a torn last line is dropped and asked again."""
    if not path.exists():
        return []
    results = []
    for line in path.read_text().splitlines():
        try:
            results.append(ItemResult.model_validate_json(line))
        except ValueError:
            continue
    return results


def write_report(out_dir: Path, results: Sequence[ItemResult], meta: dict, top_k: int) -> list[Summary]:
    rows = summarize(results)
    groups = group_means(rows)
    versions = sorted({(r.policy_version, r.retriever_version) for r in results if r.error is None})
    write_json_atomic(
        out_dir / "summary.json",
        {**meta, "served_versions": versions, "rows": [r.model_dump() for r in rows], "groups": groups},
    )
    header = f"Evaluation {json.dumps(meta)}\n\nserved (policy, retriever): {versions}\n\n"
    (out_dir / "summary.md").write_text(header + markdown(rows, groups, top_k))
    return rows
