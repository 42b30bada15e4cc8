"""Per-question scores and their summaries. Pure functions: every number here can be checked by hand."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from pydantic import BaseModel

from services.common.answers import choice_match, cover_match, exact_match, f1_score
from services.common.stats import percentile
from services.data.datasets import GROUP_OF, EvalItem


class ItemResult(BaseModel):
    """One question under one mode: what came back and how it scored (a line of results.jsonl)."""

    dataset: str
    mode: str
    id: str
    question: str
    golden_answers: list[str]
    answer: str | None
    em: float
    f1: float
    cover: float = 0.0
    recall: float | None
    retrieved_ids: list[str]
    searches: int
    latency_s: float
    policy_version: str | None = None
    retriever_version: str | None = None
    trajectory_id: str | None = None
    error: str | None = None


def answer_scores(answer: str | None, item: EvalItem) -> tuple[float, float]:
    """(EM, F1). Multiple choice scores on the letter or the option text; F1 against the option text."""
    if item.choice is not None:
        letter, option = item.choice
        em = choice_match(answer, letter, option)
        return em, max(em, f1_score(answer, [option]))
    return exact_match(answer, item.golden_answers), f1_score(answer, item.golden_answers)


def cover_score(generated: str, item: EvalItem) -> float:
    """A gold answer (for multiple choice: the gold option's text) appears in the generated text."""
    return cover_match(generated, [item.choice[1]] if item.choice else item.golden_answers)


def support_recall(retrieved_ids: Iterable[str], supporting_ids: Sequence[str]) -> float | None:
    """Share of the supporting documents found among everything the question's searches showed
    (each search shows top-k); None when the question names no supporting documents."""
    if not supporting_ids:
        return None
    seen = set(retrieved_ids)
    return sum(doc in seen for doc in set(supporting_ids)) / len(set(supporting_ids))


def _mean(values: Iterable[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return sum(present) / len(present) if present else None


def _quantile(values: list[float], q: float) -> float | None:
    return percentile(values, q) if values else None


class Summary(BaseModel):
    dataset: str
    group: str
    mode: str
    n: int
    em: float
    f1: float
    cover: float
    recall: float | None
    searches: float
    answered: float
    errors: int
    latency_p50_s: float | None
    latency_p95_s: float | None


def summarize(results: Sequence[ItemResult]) -> list[Summary]:
    """One row per (dataset, mode), in the order they first appear."""
    keys: dict[tuple[str, str], list[ItemResult]] = {}
    for r in results:
        keys.setdefault((r.dataset, r.mode), []).append(r)
    rows = []
    for (dataset, mode), rs in keys.items():
        latencies = [r.latency_s for r in rs if r.error is None]
        rows.append(
            Summary(
                dataset=dataset,
                group=GROUP_OF.get(dataset, "other"),
                mode=mode,
                n=len(rs),
                em=sum(r.em for r in rs) / len(rs),
                f1=sum(r.f1 for r in rs) / len(rs),
                cover=sum(r.cover for r in rs) / len(rs),
                recall=_mean(r.recall for r in rs),
                searches=sum(r.searches for r in rs) / len(rs),
                answered=sum(r.answer is not None for r in rs) / len(rs),
                errors=sum(r.error is not None for r in rs),
                latency_p50_s=_quantile(latencies, 0.5),
                latency_p95_s=_quantile(latencies, 0.95),
            )
        )
    return rows


def group_means(rows: Sequence[Summary]) -> list[dict[str, object]]:
    """Macro averages over a group's datasets (each dataset counts once), per mode."""
    out: dict[tuple[str, str], list[Summary]] = {}
    for row in rows:
        out.setdefault((row.group, row.mode), []).append(row)
    return [
        {"group": group, "mode": mode, "datasets": len(rs), "em": _mean(r.em for r in rs),
         "f1": _mean(r.f1 for r in rs), "cover": _mean(r.cover for r in rs), "recall": _mean(r.recall for r in rs)}
        for (group, mode), rs in out.items()
    ]  # fmt: skip
