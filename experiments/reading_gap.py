"""Does the policy read? log pi(y* | x, gold passage) - log pi(y* | x, a random passage), per policy (issue 38).

On held-out *training-pool* questions (never the evaluation split, never trained on: the reading adapter's
`hold_out` file and its manifest's held-out ids), each question is written as the agent's own trajectory: its
prompt, its first `<search>`, one `<information>` block, `<think> I found the answer. </think>` and `<answer>`. The
block shows either the supporting passage that holds the answer or a random corpus passage that holds no gold
alias; y* is the answer as that supporting passage writes it. The gap (nats, summed over y*'s tokens) is what the
evidence is worth to the policy: a policy that reads scores y* far higher with the gold passage. Label answers
(yes/no, option letters) are left out: y* is not in the passage. Policies are compared per question (sign test),
the gap's mean with a 95 % bootstrap interval over questions.

    python -m experiments.reading_gap --qa-dir ../shared/data/qa --corpus-dir ../shared/data/corpus \
        --policy base= --policy warmstart=services/modeling/adapters/protocol \
        --policy reading=services/modeling/adapters/reading --out docs/results/reading-gap
"""

from __future__ import annotations

import argparse
import json
import random
import shlex
import sys
import time
from pathlib import Path

import torch
from tqdm import tqdm

from bench.script import REPO
from experiments.lower_level import load_corpora
from services.common.answers import contains_gold
from services.eval.stats import bootstrap_questions, sign_test
from services.modeling.shipped import load_shipped_manifest
from services.trainer.warmstart.examples import PoolItem, Shown, search_query, to_example, training_pool
from services.trainer.warmstart.reading import answer_as_written, closed_answer
from services.trainer.warmstart.sft import token_nll


def held_out_questions(qa_dir: Path, adapter: Path, hold_out: Path | None) -> list[PoolItem]:
    """The adapter's held-out questions (its manifest) and the `hold_out` file's, training-pool rows only."""
    manifest = load_shipped_manifest(adapter) or {}
    data = manifest.get("data", {})
    wanted = set(data.get("heldout_ids", [])) | set(data.get("hold_out_ids", []))
    if hold_out is not None:
        wanted |= {line.strip() for line in hold_out.read_text().splitlines() if line.strip()}
    trained = {f"{d}:{i}" for d, ids in data.get("trained_ids", {}).items() for i in ids}
    if wanted & trained:
        raise ValueError(f"{len(wanted & trained)} held-out question(s) were trained on, e.g. {min(wanted & trained)}")
    items = []
    for dataset in sorted({w.split(":", 1)[0] for w in wanted}):
        items += [i for i in training_pool(qa_dir, dataset) if f"{dataset}:{i.id}" in wanted]
    return items


def pairs(items: list[PoolItem], docs: dict[str, tuple[str, str]], tokenizer, seed: int) -> list[dict]:
    """Per question with an extractive answer: the gold-passage example and the random-passage example."""
    rng = random.Random(seed)
    ids = list(docs)
    out = []
    for item in items:
        if closed_answer(item):
            continue
        gold = next(((d, *docs[d]) for d in item.supporting_doc_ids if d in docs
                     and answer_as_written(item.golden_answers, [f"{docs[d][0]}\n{docs[d][1]}"])), None)  # fmt: skip
        if gold is None:
            continue
        answer = answer_as_written(item.golden_answers, [f"{gold[1]}\n{gold[2]}"])
        while True:
            other = rng.choice(ids)
            if other not in item.supporting_doc_ids and not contains_gold(item.golden_answers, " ".join(docs[other])):
                break
        query = search_query(item.question)
        shown = {"gold": Shown(query, (gold,)), "random": Shown(query, ((other, *docs[other]),))}
        examples = {k: to_example(tokenizer, item, [s], answer=answer) for k, s in shown.items()}
        out.append({"question": f"{item.dataset}:{item.id}", "answer": answer, "examples": examples})
    return out


def load_policy(base: Path, adapter: Path | None):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(base), dtype=torch.float32)
    if adapter is not None:
        model = PeftModel.from_pretrained(model, str(adapter)).merge_and_unload()
    return model.eval()


def answer_logprob(model, example, placement) -> float:
    positions = [t for t in range(len(example.input_ids) - 1) if example.answer_mask[t + 1]]
    with torch.no_grad():
        return -float(token_nll(model, example.input_ids, positions, placement).sum())


def main() -> None:
    from transformers import AutoTokenizer

    from services.common.settings import CommonSettings
    from services.trainer.device import Placement

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--qa-dir", type=Path, required=True)
    parser.add_argument("--corpus-dir", type=Path, required=True)
    parser.add_argument(
        "--policy",
        action="append",
        required=True,
        help="name=ADAPTER_DIR (empty: the raw base); the first is the baseline of the sign tests.",
    )
    parser.add_argument(
        "--questions-from",
        type=Path,
        default=REPO / "services" / "modeling" / "adapters" / "reading",
        help="An adapter whose manifest names the held-out questions.",
    )
    parser.add_argument("--hold-out", type=Path, default=REPO / "configs" / "warmstart" / "teacher-questions.txt")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()  # fmt: skip
    command = "python -m experiments.reading_gap " + shlex.join(sys.argv[1:])
    started = time.perf_counter()
    base = CommonSettings().base_policy_model_dir
    tokenizer = AutoTokenizer.from_pretrained(str(base))
    items = held_out_questions(args.qa_dir, args.questions_from, args.hold_out)
    rows = pairs(items, load_corpora(args.corpus_dir), tokenizer, args.seed)
    placement = Placement.resolve("cpu", cpu_bf16=False)
    policies = dict(p.split("=", 1) for p in args.policy)
    for name, adapter in policies.items():
        model = load_policy(base, Path(adapter) if adapter else None)
        for row in tqdm(rows, desc=name, unit="q"):
            gold, other = (answer_logprob(model, row["examples"][k], placement) for k in ("gold", "random"))
            row[name] = {"gold": gold, "random": other, "gap": gold - other}
    names = list(policies)
    summary = {}
    for name in names:
        gaps = [r[name]["gap"] for r in rows]
        interval = bootstrap_questions([[g] for g in gaps], seed=args.seed)
        summary[name] = {"n": len(gaps), "gap": interval.value, "ci": [interval.low, interval.high],
                         "gold_logprob": sum(r[name]["gold"] for r in rows) / len(rows),
                         "random_logprob": sum(r[name]["random"] for r in rows) / len(rows)}  # fmt: skip
        if name != names[0]:
            test = sign_test([r[names[0]]["gap"] for r in rows], gaps)
            summary[name]["vs_" + names[0]] = {"up": test.better, "down": test.worse, "p": test.p}
    elapsed = time.perf_counter() - started
    args.out.mkdir(parents=True, exist_ok=True)
    for row in rows:
        del row["examples"]
    (args.out / "results.json").write_text(json.dumps({"command": command, "wall_s": elapsed, "summary": summary,
                                                       "questions": rows}, indent=1))  # fmt: skip
    lines = [
        f"`{command}` ({elapsed:.0f} s, {len(rows)} held-out training questions)",
        "",
        "| policy | log pi(y*, gold) | log pi(y*, random) | gap (95 % CI) | vs " + names[0] + " |",
        "|---|---|---|---|---|",
    ]
    for name, s in summary.items():
        versus = s.get("vs_" + names[0])
        lines.append(
            f"| {name} | {s['gold_logprob']:.2f} | {s['random_logprob']:.2f} | {s['gap']:.2f} "
            f"({s['ci'][0]:.2f}–{s['ci'][1]:.2f}) | "
            + (f"+{versus['up']}/−{versus['down']} (p = {versus['p']:.2g})" if versus else "—")
            + " |"
        )
    (args.out / "results.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
