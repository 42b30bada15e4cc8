"""A warm start's questions and examples: which are drawn, which are held out, which cached build they reuse."""

from __future__ import annotations

import random
import sys
from collections import Counter
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from services.data.split import SplitViolation
from services.trainer.warmstart.config import WarmstartConfig
from services.trainer.warmstart.examples import PoolItem, SFTExample


def select_items(pools: dict[str, list[PoolItem]], config: WarmstartConfig) -> list[PoolItem]:
    rng = random.Random(config.seed)
    chosen = []
    for dataset in config.datasets:
        pool = list(pools[dataset])
        rng.shuffle(pool)
        chosen += pool if config.per_dataset is None else pool[: config.per_dataset]
    return chosen


def cached_examples(path: Path, pools: dict[str, list[PoolItem]], items: Sequence[PoolItem], *,
                    same_config: bool = False) -> list[SFTExample]:  # fmt: skip
    """The examples kept at `path` when they are exactly the questions this run draws; [] when there are none or
    they were built for another draw (datasets, count, seed): the caller builds anew. An example that is not a
    training-pool question (the evaluation split, another file) is refused, never trained on. `same_config`: the
    examples are a resumed run's own (its config checked equal), so they were built from this very draw, and a drawn
    question that gave no example (a build may drop one) does not make them another draw."""
    if not path.exists():
        return []
    examples = [SFTExample.model_validate_json(line) for line in path.open()]
    pool_ids = {(i.dataset, i.id) for pool in pools.values() for i in pool}
    missing = [e for e in examples if (e.dataset, e.id) not in pool_ids]
    if missing:
        raise SplitViolation(f"{len(missing)} example(s) are not training-pool questions, e.g. {missing[0].id}")
    built, drawn = {(e.dataset, e.id) for e in examples}, {(i.dataset, i.id) for i in items}
    if not (built <= drawn if same_config else built == drawn):
        print(f"{path}: built for another draw of questions; rebuilding", file=sys.stderr)
        return []
    return examples


def data_summary(examples: Sequence[SFTExample]) -> dict[str, Any]:
    by_dataset: dict[str, dict[str, float]] = {}
    for dataset in sorted({e.dataset for e in examples}):
        rows = [e for e in examples if e.dataset == dataset]
        recalls = [e.support_recall for e in rows if e.support_recall is not None]
        by_dataset[dataset] = {
            "examples": len(rows),
            "answer_shown": round(sum(e.answer_shown for e in rows) / len(rows), 4),
            "second_search": round(sum(len(e.searches) > 1 for e in rows) / len(rows), 4),
            "support_recall": round(sum(recalls) / len(recalls), 4) if recalls else None,
            "mean_tokens": round(sum(len(e.input_ids) for e in rows) / len(rows), 1),
            "mean_target_tokens": round(sum(sum(e.loss_mask) for e in rows) / len(rows), 1),
            "kinds": dict(sorted(Counter(e.kind for e in rows).items())),
        }
    return by_dataset


def heldout_draw(keys: Iterable[str], config: WarmstartConfig) -> tuple[list[str], list[str]]:
    """The seeded split of question keys ('dataset:id', those within max_len) into held-out and training ones."""
    drawn = sorted(k for k in keys if k not in set(config.hold_out))
    random.Random(config.seed + 1).shuffle(drawn)
    return drawn[: config.heldout], drawn[config.heldout :]


def split_heldout(
    examples: Sequence[SFTExample], config: WarmstartConfig, heldout_keys: Sequence[str] | None = None
) -> tuple[list[list[SFTExample]], list[SFTExample]]:
    """Training groups (every variant of a question together) and the held-out examples (the first variant of
    `config.heldout` seeded questions: held-out *training-pool* questions, never the evaluation split).
    `heldout_keys`: hold out exactly these ('dataset:id'; a continued run or a new stage keeps its adapter's). One
    with no example in this build (another recipe's variants, or another machine's passages, all over `max_len`)
    stays out of training and out of the held-out loss; the manifest still lists it as held out."""
    groups: dict[str, list[SFTExample]] = {}
    for e in examples:
        if len(e.input_ids) <= config.max_len:
            groups.setdefault(f"{e.dataset}:{e.id}", []).append(e)
    held, trained = heldout_draw(groups, config)
    if heldout_keys is not None:
        carried = set(heldout_keys)
        held, trained = [k for k in heldout_keys if k in groups], [k for k in held + trained if k not in carried]
    heldout = [groups[k][0] for k in held]
    train = [groups[k] for k in trained]
    if config.two_search_repeat > 1:  # a reading run's bridge and second-search variants too
        train += [[e] for g in train for e in g if len(e.searches) > 1 for _ in range(config.two_search_repeat - 1)]
    return train, heldout
