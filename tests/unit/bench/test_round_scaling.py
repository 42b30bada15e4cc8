"""bench/round_scaling.py's shapes are prefixes of one rollout set: the right questions, rollouts and documents."""

from bench.round_scaling import shape, subset_batch


def rollout(item: str, group_index: int, candidates: list[str]) -> dict:
    search = {"candidates": [{"id": c, "score": 0.0} for c in candidates]}
    return {"item_id": item, "group_index": group_index, "turns": [{"search": search}, {"search": None}]}


def test_subset_takes_the_first_questions_first_rollouts_and_only_their_documents():
    records = [rollout(item, g, [f"{item}-doc", "shared"]) for item in ("q1", "q2", "q3") for g in range(4)]
    docs = {d: ("title", "text") for d in ("q1-doc", "q2-doc", "q3-doc", "shared", "unused")}
    batch = subset_batch({"records": records, "docs": docs}, questions=2, group=3)
    assert [(r["item_id"], r["group_index"]) for r in batch["records"]] == [
        ("q1", 0), ("q1", 1), ("q1", 2), ("q2", 0), ("q2", 1), ("q2", 2),
    ]  # fmt: skip
    assert set(batch["docs"]) == {"q1-doc", "q2-doc", "shared"}


def test_shape_parses_questions_by_group():
    assert shape("16x4") == (16, 4)
    assert shape("8X2") == (8, 2)
