"""A trained query tower goes live through the running retriever's hot swap, and the agent's EM is measured
before and after, through the services (issue 28, part 3's last step).

`export` turns an arm of `experiments.lower_level` (its LoRA adapter, or its full tower) into a retriever
checkpoint the service loads: the query tower with the LoRA merged in, the document tower unchanged, so
activating it re-embeds nothing. `compare` pairs two `bridge-rl eval` runs of the same questions (the start
tower, then the swapped one) per question: EM, F1 and the recall of the supporting passages among what the
agent's own searches returned, with the exact sign test per dataset and pooled.

    python -m experiments.swap_em export --arm-dir docs/results/lower-level-lora-848/supervised \
        --root $BRIDGE_DATA_DIR/checkpoints --version lower-supervised-848
    bridge-rl checkpoints register lower-supervised-848 --url http://127.0.0.1:8101
    bridge-rl eval --dataset 2wikimultihopqa,hotpotqa --mode agent --limit 100 ... --out .cache/swap/before
    bridge-rl eval ... --retriever lower-supervised-848 --out .cache/swap/after
    python -m experiments.swap_em compare --before .cache/swap/before --after .cache/swap/after \
        --out docs/results/swap-em/supervised-848
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from pathlib import Path

from bench.script import prepare_models
from services.common.checkpoints import write_json_atomic
from services.eval.report import read_results
from services.eval.scoring import ItemResult
from services.eval.stats import sign_test
from services.trainer.checkpoint import write_retriever
from services.trainer.models import RETRIEVER_LORA_FILE, RetrieverModel

TOWER = "query_encoder.safetensors"
METRICS = ("em", "f1", "recall")


def export(arm_dir: Path, root: Path, version: str, retriever_base: Path) -> Path:
    """The arm's trained tower (over the encoder in `retriever_base`) as a retriever checkpoint under `root`:
    LoRA mode when the arm left an adapter."""
    params = "lora" if (arm_dir / RETRIEVER_LORA_FILE).exists() else "full"
    if params == "full" and not (arm_dir / TOWER).exists():
        raise FileNotFoundError(f"{arm_dir} holds neither {RETRIEVER_LORA_FILE} nor {TOWER}: run the arm first")
    retriever = RetrieverModel(retriever_base, arm_dir / TOWER, params=params)
    return write_retriever(root, retriever, version, None, extra={"source": str(arm_dir)})


def by_question(results: Sequence[ItemResult]) -> dict[tuple[str, str], ItemResult]:
    """(dataset, id) -> the agent-mode result; a question asked twice keeps the last answer."""
    return {(r.dataset, r.id): r for r in results if r.mode == "agent"}


def value(result: ItemResult, metric: str) -> float:
    """A failed question scores 0, as the eval counts it; recall is that of the agent's own searches."""
    got = getattr(result, metric)
    return 0.0 if got is None or result.error else float(got)


def compare(before: Sequence[ItemResult], after: Sequence[ItemResult]) -> dict:
    """Per dataset and pooled: mean before / after and the paired sign test of every metric, on the questions
    both runs answered. Raises if the runs share no question (not the same questions, or not agent mode)."""
    old, new = by_question(before), by_question(after)
    shared = sorted(set(old) & set(new))
    if not shared:
        raise ValueError("the two runs share no agent-mode question")
    groups: dict[str, list[tuple[str, str]]] = {}
    for key in shared:
        groups.setdefault(key[0], []).append(key)
    groups["pooled"] = shared
    rows = {}
    for name, keys in groups.items():
        row: dict = {"n": len(keys)}
        for metric in METRICS:
            a = [value(old[k], metric) for k in keys]
            b = [value(new[k], metric) for k in keys]
            row[metric] = {"before": sum(a) / len(a), "after": sum(b) / len(b),
                           "sign": sign_test(a, b).model_dump()}  # fmt: skip
        row["versions"] = {
            "before": sorted({str(old[k].retriever_version) for k in keys}),
            "after": sorted({str(new[k].retriever_version) for k in keys}),
        }
        rows[name] = row
    return rows


def markdown(rows: dict) -> str:
    lines = ["| dataset | n | EM before → after | sign test | F1 before → after | recall before → after | sign test |",
             "|---|---|---|---|---|---|---|"]  # fmt: skip
    for name, row in rows.items():
        cells = []
        for metric in METRICS:
            m = row[metric]
            cells.append(f"{m['before']:.3f} → {m['after']:.3f}")
            if metric != "f1":
                s = m["sign"]
                cells.append(f"+{s['better']}/−{s['worse']} (p = {s['p']:.2g})")
        lines.append(f"| {name} | {row['n']} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    ex = sub.add_parser("export", help="An arm's trained tower as a retriever checkpoint.")
    ex.add_argument("--arm-dir", type=Path, required=True, help="experiments.lower_level's <out>/<arm> folder.")
    ex.add_argument("--root", type=Path, required=True, help="The retriever service's checkpoint root.")
    ex.add_argument("--version", required=True)
    ex.add_argument("--work", type=Path, default=Path(".cache") / "swap-em", help="Where models are prepared.")
    cmp = sub.add_parser("compare", help="Pair two eval runs' agent answers per question.")
    cmp.add_argument("--before", type=Path, required=True, help="bridge-rl eval --out of the start tower.")
    cmp.add_argument("--after", type=Path, required=True, help="... of the swapped tower, same questions.")
    cmp.add_argument("--out", type=Path, required=True, help="Writes <out>.md and <out>.json.")
    args = parser.parse_args()
    if args.command == "export":
        print(export(args.arm_dir, args.root, args.version, prepare_models(args.work, policy=False).retriever))
        return
    rows = compare(read_results(args.before / "results.jsonl"), read_results(args.after / "results.jsonl"))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    write_json_atomic(args.out.with_suffix(".json"), rows)
    args.out.with_suffix(".md").write_text(markdown(rows))
    print(markdown(rows))
    print(json.dumps({k: v["em"]["sign"] for k, v in rows.items()}))


if __name__ == "__main__":
    main()
