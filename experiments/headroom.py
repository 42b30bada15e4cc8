"""Headroom: how much a better retriever could add, per dataset whose questions name supporting passages.

On the evaluation split (the first EVAL_SPLIT questions of each file, services/data/split.py), per dataset:
- EM / F1 of `agent` and of `oracle` (the agent shown the question's supporting passages as its first
  <information> block), read from `bridge-rl eval` results (results.jsonl), paired per question; the EM gap
  oracle - agent is what better evidence is worth to this policy, with the exact paired sign test
  (services/eval/stats.py; a question either run failed on counts as wrong, as the eval counts it);
- recall@3 and recall@10 of the supporting passages with the question as the query: from the served retriever
  (greedy top-k over its HNSW index) and from an exact scan over the same vectors (`"exact": true` on
  /v1/search). served < exact is the ANN index's loss; 1 - exact is the encoder's.

    bridge-rl eval --dataset all --mode agent --mode oracle --limit 100 --qa-dir ../shared/data/qa \
        --url http://127.0.0.1:8100 --retriever-url http://127.0.0.1:8101 --out .cache/eval-headroom
    python -m experiments.headroom --eval-dir .cache/eval-headroom --qa-dir ../shared/data/qa \
        --retriever-url http://127.0.0.1:8101 --out .cache/eval-headroom/headroom

writes <out>.md and <out>.json. Several --eval-dir are read together (e.g. agent and oracle from separate runs);
a (dataset, mode, question) found twice keeps the last. The retriever must serve the version the eval used.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable, Sequence
from pathlib import Path

from services.common.checkpoints import write_json_atomic
from services.data.datasets import EvalItem, available, load_items
from services.data.split import EVAL_SPLIT
from services.eval.report import read_results
from services.eval.scoring import ItemResult, support_recall
from services.eval.stats import sign_test

KS = (3, 10)
# (questions, k, exact) -> the ids of each question's top k, best first
Search = Callable[[list[str], int, bool], list[list[str]]]


def recall_at(ranked: Sequence[str], supporting: Sequence[str], k: int) -> float:
    """Share of the supporting passages among the first k of `ranked`."""
    value = support_recall(ranked[:k], supporting)
    if value is None:
        raise ValueError("recall needs at least one supporting passage")
    return value


def retrieval_recall(search: Search, items: Sequence[EvalItem], ks: Sequence[int] = KS) -> dict[str, float]:
    """Mean recall@k over `items` (each names supporting passages), served (`served@k`) and exact (`exact@k`)."""
    questions = [item.question for item in items]
    out = {}
    for kind, exact in (("served", False), ("exact", True)):
        ranked = search(questions, max(ks), exact)
        for k in ks:
            out[f"{kind}@{k}"] = sum(
                recall_at(r, item.supporting_doc_ids, k) for r, item in zip(ranked, items, strict=True)
            ) / len(items)
    return out


def paired(results: Sequence[ItemResult], items: Sequence[EvalItem]) -> list[tuple[ItemResult, ItemResult]]:
    """(agent, oracle) rows of the same question, in the question file's order; a question missing either is left
    out. The last row of a (dataset, mode, id) wins (a resumed run rewrites its errors)."""
    by_key = {(r.dataset, r.mode, r.id): r for r in results}
    pairs = []
    for item in items:
        agent, oracle = by_key.get((item.dataset, "agent", item.id)), by_key.get((item.dataset, "oracle", item.id))
        if agent is not None and oracle is not None:
            pairs.append((agent, oracle))
    return pairs


def _mean(values: Sequence[float]) -> float | None:
    return sum(values) / len(values) if values else None


def dataset_row(dataset: str, items: Sequence[EvalItem], results: Sequence[ItemResult], search: Search) -> dict:
    pairs = paired(results, items)
    agent = [a for a, _ in pairs]
    oracle = [o for _, o in pairs]
    em_agent, em_oracle = _mean([r.em for r in agent]), _mean([r.em for r in oracle])
    row = {
        "dataset": dataset,
        "questions": len(items),
        "n": len(pairs),
        "agent_em": em_agent,
        "oracle_em": em_oracle,
        "em_gap": None if em_agent is None else em_oracle - em_agent,
        "sign_test_em": sign_test([r.em for r in agent], [r.em for r in oracle]).model_dump() if pairs else None,
        "agent_f1": _mean([r.f1 for r in agent]),
        "oracle_f1": _mean([r.f1 for r in oracle]),
        "agent_recall": _mean([r.recall for r in agent if r.recall is not None]),
        "errors": {
            "agent": sum(r.error is not None for r in agent),
            "oracle": sum(r.error is not None for r in oracle),
        },
        "eval_retriever_versions": sorted({r.retriever_version for r in agent + oracle if r.retriever_version}),
    }
    return row | {"recall": retrieval_recall(search, items)}


def headroom(
    qa_dir: Path, results: Sequence[ItemResult], search: Search, datasets: Sequence[str] | None = None,
    limit: int = EVAL_SPLIT,
) -> dict:  # fmt: skip
    """Every dataset of `qa_dir` (or `datasets`) whose evaluation-split questions name supporting passages, one
    row each, and their macro mean; the datasets without any are listed, not scored."""
    rows, skipped = [], []
    for dataset in datasets or available(qa_dir):
        items = [i for i in load_items(qa_dir, dataset, limit) if i.supporting_doc_ids]
        if items:
            rows.append(dataset_row(dataset, items, results, search))
        else:
            skipped.append(dataset)
    scored = [r for r in rows if r["n"]]
    mean = {key: _mean([r[key] for r in scored]) for key in ("agent_em", "oracle_em", "em_gap", "agent_f1",
                                                              "oracle_f1")}  # fmt: skip
    mean["recall"] = {key: _mean([r["recall"][key] for r in rows]) for key in rows[0]["recall"]} if rows else {}
    all_pairs = [p for r in rows for p in paired(results, load_items(qa_dir, r["dataset"], limit))]
    pooled = sign_test([a.em for a, _ in all_pairs], [o.em for _, o in all_pairs]) if all_pairs else None
    return {"limit": limit, "rows": rows, "mean": mean, "pooled_sign_test_em": pooled and pooled.model_dump(),
            "no_supporting_passages": skipped}  # fmt: skip


def _f(value: float | None, signed: bool = False) -> str:
    return "–" if value is None else (f"{value:+.3f}" if signed else f"{value:.3f}")


def _sign(test: dict | None) -> str:
    return "–" if test is None else f"+{test['better']}/−{test['worse']} (p = {test['p']:.2g})"


def markdown(report: dict) -> str:
    ks = [k for k in report["mean"].get("recall", {}) if k.startswith("served@")]
    heads = [f"recall@{k.split('@')[1]} served / exact" for k in ks]
    lines = [
        "| dataset | n | agent EM | oracle EM | EM gap (oracle − agent) | oracle vs agent, EM (sign test) | agent F1 "
        "| oracle F1 | agent recall (own searches) | " + " | ".join(heads) + " |",
        "|---|---|---|---|---|---|---|---|---|" + "---|" * len(heads),
    ]
    for r in report["rows"]:
        recalls = " | ".join(f"{_f(r['recall'][k])} / {_f(r['recall'][k.replace('served', 'exact')])}" for k in ks)
        lines.append(
            f"| {r['dataset']} | {r['n']} | {_f(r['agent_em'])} | {_f(r['oracle_em'])} | {_f(r['em_gap'], True)} | "
            f"{_sign(r['sign_test_em'])} | {_f(r['agent_f1'])} | {_f(r['oracle_f1'])} | {_f(r['agent_recall'])} | "
            f"{recalls} |"
        )
    m = report["mean"]
    recalls = " | ".join(f"{_f(m['recall'][k])} / {_f(m['recall'][k.replace('served', 'exact')])}" for k in ks)
    lines.append(
        f"| **mean** | {sum(r['n'] for r in report['rows'])} | {_f(m['agent_em'])} | {_f(m['oracle_em'])} | "
        f"{_f(m['em_gap'], True)} | {_sign(report['pooled_sign_test_em'])} (pooled) | {_f(m['agent_f1'])} | "
        f"{_f(m['oracle_f1'])} | | {recalls} |"
    )
    notes = [
        "",
        f"Evaluation split: the first {report['limit']} questions of each file, those naming supporting passages. "
        "Recall: the question as the query, top-k of the served retriever (greedy, HNSW) / of an exact scan over "
        "the same vectors.",
    ]
    if report["no_supporting_passages"]:
        notes.append(f"No supporting passages (not scored): {', '.join(report['no_supporting_passages'])}.")
    return "\n".join(lines + notes) + "\n"


def served_search(url: str, batch: int = 128) -> Search:
    """`Search` over a running retriever's /v1/search (greedy; `exact` for the full scan)."""
    from services.common.clients.retriever import RetrieverClient

    def search(questions: list[str], k: int, exact: bool) -> list[list[str]]:
        ranked = []
        with RetrieverClient(url, timeout=600) as client:
            for start in range(0, len(questions), batch):
                response = client.search(questions[start : start + batch], top_k=k, candidates=k, exact=exact)
                ranked += [[d.id for d in result.docs] for result in response.results]
        return ranked

    return search


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--eval-dir", type=Path, action="append", required=True,
                        help="A `bridge-rl eval --out` folder with agent and/or oracle rows (repeatable).")  # fmt: skip
    parser.add_argument("--qa-dir", type=Path, required=True, help="The question files the eval read.")
    parser.add_argument("--retriever-url", default="http://127.0.0.1:8101")
    parser.add_argument("--dataset", action="append", help="Only these datasets (repeatable); default every one.")
    parser.add_argument("--limit", type=int, default=EVAL_SPLIT, help="The first N questions of each file.")
    parser.add_argument("--out", type=Path, required=True, help="Writes <out>.md and <out>.json.")
    args = parser.parse_args()

    results = [r for d in args.eval_dir for r in read_results(d / "results.jsonl")]
    if not results:
        raise SystemExit(f"no results.jsonl rows in {[str(d) for d in args.eval_dir]}")
    report = headroom(args.qa_dir, results, served_search(args.retriever_url), args.dataset, args.limit)
    report["eval_dirs"] = [str(d) for d in args.eval_dir]
    args.out.parent.mkdir(parents=True, exist_ok=True)
    write_json_atomic(args.out.with_suffix(".json"), report)
    table = markdown(report)
    args.out.with_suffix(".md").write_text(table)
    print(table)
    missing = [r["dataset"] for r in report["rows"] if not r["n"]]
    if missing:
        print(f"no paired agent + oracle rows for {missing}: run `bridge-rl eval --mode agent --mode oracle` on them")
    print(json.dumps({"written": [str(args.out.with_suffix(s)) for s in (".md", ".json")]}))


if __name__ == "__main__":
    main()
