"""Both index implementations on the same data: same neighbours, idempotent upserts, atomic aliases."""

import numpy as np
import pytest

from services.retriever.backends.index import EdgeIndex, QdrantClientIndex


@pytest.fixture(params=["edge", "qdrant-local"])
def index(request, tmp_path):
    idx = EdgeIndex(tmp_path / "edge") if request.param == "edge" else QdrantClientIndex(path=tmp_path / "local")
    yield idx
    idx.close()


def unit_vectors(n, d, seed):
    x = np.random.default_rng(seed).standard_normal((n, d)).astype(np.float32)
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def payloads(n, prefix="doc"):
    return [{"doc_id": f"{prefix}-{i}", "title": f"t{i}", "text": f"text {i}"} for i in range(n)]


def test_search_matches_exact_inner_product(index):
    vectors = unit_vectors(300, 16, 0)
    index.create_collection("c", 16)
    index.upsert("c", vectors, payloads(300))
    queries = unit_vectors(5, 16, 1)
    hits = index.search("c", queries, 5)
    exact = np.argsort(-(queries @ vectors.T), axis=1)[:, :5]
    for row, ids in zip(hits, exact, strict=True):
        assert [h.doc_id for h in row] == [f"doc-{i}" for i in ids]
        assert [h.score for h in row] == sorted((h.score for h in row), reverse=True)
        assert row[0].payload["text"].startswith("text")


def test_upsert_is_idempotent_and_delete_works(index):
    vectors = unit_vectors(20, 8, 2)
    index.create_collection("c", 8)
    index.upsert("c", vectors, payloads(20))
    index.upsert("c", vectors, payloads(20))
    assert index.count("c") == 20
    index.delete("c", ["doc-3"])
    assert index.count("c") == 19
    assert set(index.retrieve("c", ["doc-3", "doc-4"])) == {"doc-4"}
    scrolled = [p["doc_id"] for batch in index.scroll("c", batch=7) for p in batch]
    assert sorted(scrolled) == sorted(f"doc-{i}" for i in range(20) if i != 3)


def test_alias_points_at_one_collection(index):
    index.create_collection("a", 4)
    index.create_collection("b", 4)
    assert index.get_alias("docs") is None
    index.set_alias("docs", "a")
    index.set_alias("docs", "b")
    assert index.get_alias("docs") == "b"
    index.drop_collection("a")
    assert not index.collection_exists("a") and index.collection_exists("b")


def test_edge_index_survives_reopen(tmp_path):
    index = EdgeIndex(tmp_path)
    index.create_collection("c", 8)
    index.upsert("c", unit_vectors(10, 8, 3), payloads(10))
    index.set_alias("docs", "c")
    index.close()
    reopened = EdgeIndex(tmp_path)
    assert reopened.count("c") == 10 and reopened.get_alias("docs") == "c"
    reopened.close()
