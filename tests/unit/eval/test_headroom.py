"""The headroom table's numbers on a tiny hand-made index and hand-made eval rows: exact search is the brute-force
order, recall@k of the supporting passages, the agent/oracle pairing, EM gap and sign test."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from experiments.headroom import headroom, markdown, paired, recall_at, retrieval_recall
from services.data.datasets import EvalItem
from services.eval.scoring import ItemResult
from services.retriever.backends.index import EdgeIndex, QdrantClientIndex

# Six documents on the unit circle at 0, 20, 40, ..., 100 degrees; a query at angle a ranks them by |a - angle|.
ANGLES = [0, 20, 40, 60, 80, 100]


def circle(degrees) -> np.ndarray:
    rad = np.radians(np.asarray(degrees, dtype=np.float64))
    return np.stack([np.cos(rad), np.sin(rad)], axis=1).astype(np.float32)


@pytest.fixture(params=["edge", "qdrant-local"])
def index(request, tmp_path):
    idx = EdgeIndex(tmp_path / "edge") if request.param == "edge" else QdrantClientIndex(path=tmp_path / "local")
    idx.create_collection("c", 2)
    idx.upsert("c", circle(ANGLES), [{"doc_id": f"d{a}", "title": "", "text": str(a)} for a in ANGLES])
    yield idx
    idx.close()


def test_exact_search_is_the_brute_force_order(index):
    queries = circle([5, 75, 100])
    exact = index.search("c", queries, 3, exact=True)
    # By hand: nearest angles first.
    assert [[h.doc_id for h in row] for row in exact] == [["d0", "d20", "d40"], ["d80", "d60", "d100"],
                                                          ["d100", "d80", "d60"]]  # fmt: skip
    brute = np.argsort(-(queries @ circle(ANGLES).T), axis=1)[:, :3]
    assert [[h.doc_id for h in row] for row in exact] == [[f"d{ANGLES[i]}" for i in row] for row in brute]
    assert [[h.doc_id for h in row] for row in index.search("c", queries, 3)] == [
        [h.doc_id for h in row] for row in exact
    ]  # six vectors: the HNSW search is exact too


def test_recall_at_k_by_hand(index):
    assert recall_at(["a", "b", "c"], ["c", "x"], 2) == 0.0
    assert recall_at(["a", "b", "c"], ["c", "x"], 3) == 0.5
    assert recall_at(["a", "b", "c"], ["c", "c", "a"], 3) == 1.0  # each passage counts once
    with pytest.raises(ValueError):
        recall_at(["a"], [], 1)

    angle_of = {"q5": 5, "q75": 75}
    items = [
        EvalItem(id="1", dataset="t", question="q5", golden_answers=["x"], supporting_doc_ids=["d40", "d100"]),
        EvalItem(id="2", dataset="t", question="q75", golden_answers=["x"], supporting_doc_ids=["d80"]),
    ]

    def search(questions, k, exact):
        hits = index.search("c", circle([angle_of[q] for q in questions]), k, exact=exact)
        ids = [[h.doc_id for h in row] for row in hits]
        return ids if exact else [row[1:] for row in ids]  # a lossy "served" index: it misses each top hit

    got = retrieval_recall(search, items, ks=(1, 3))
    # exact: q5 -> d0 d20 d40 (d40 of 2 supporting at k=3), q75 -> d80 d60 d100 (d80 at k=1)
    # served: q5 -> d20 d40 (1/2 at k=3), q75 -> d60 d100 (0 at k=1 and k=3)
    assert got == {"served@1": 0.0, "served@3": 0.25, "exact@1": 0.5, "exact@3": 0.75}


def _row(dataset, mode, qid, em, error=None):
    return ItemResult(dataset=dataset, mode=mode, id=qid, question="q", golden_answers=["a"], answer=None, em=em,
                      f1=em, recall=0.5 if mode == "agent" else None, retrieved_ids=[], searches=1, latency_s=1.0,
                      retriever_version="base", error=error)  # fmt: skip


def test_headroom_pairs_agent_and_oracle_per_question(tmp_path):
    def write(name, rows):
        (tmp_path / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))

    write("nq", [{"id": f"n{i}", "question": f"q{i}?", "golden_answers": ["a"],
                  "metadata": {"supporting_doc_ids": [f"d{i}"]}} for i in range(6)])  # fmt: skip
    write("triviaqa", [{"id": "t0", "question": "q?", "golden_answers": ["a"]}])  # no supporting passages
    results = [_row("nq", "agent", f"n{i}", em) for i, em in enumerate([0, 0, 1, 1, 0, 0])]
    results += [_row("nq", "oracle", f"n{i}", em) for i, em in enumerate([1, 1, 1, 0, 1])]  # n5 never asked
    results += [_row("nq", "oracle", "n4", 0.0, error="502: retriever")]  # a later failed retry: the last row wins
    results += [_row("nq", "agent", "n0", 0.0), _row("nq", "direct", "n1", 1.0)]

    def search(questions, k, exact):
        return [[f"d{q[1:-1]}"] if exact else ["zz"] for q in questions]

    report = headroom(tmp_path, results, search, limit=100)
    assert report["no_supporting_passages"] == ["triviaqa"]
    [row] = report["rows"]
    assert (row["dataset"], row["questions"], row["n"]) == ("nq", 6, 5)
    # agent 0 0 1 1 0, oracle 1 1 1 0 0 (n4's last row failed): +2 / -1
    assert row["agent_em"] == pytest.approx(0.4) and row["oracle_em"] == pytest.approx(0.6)
    assert row["em_gap"] == pytest.approx(0.2)
    assert row["sign_test_em"] == {"better": 2, "worse": 1, "ties": 2, "p": 1.0}
    assert row["errors"] == {"agent": 0, "oracle": 1}
    assert row["recall"] == {"served@3": 0.0, "served@10": 0.0, "exact@3": 1.0, "exact@10": 1.0}
    assert report["pooled_sign_test_em"]["p"] == 1.0 and report["mean"]["em_gap"] == pytest.approx(0.2)
    table = markdown(report)
    assert "| nq | 5 | 0.400 | 0.600 | +0.200 | +2/−1 (p = 1) |" in table
    assert "0.000 / 1.000 | 0.000 / 1.000 |" in table and "triviaqa" in table
    assert len(paired(results, [])) == 0 and math.isclose(row["agent_recall"], 0.5)
