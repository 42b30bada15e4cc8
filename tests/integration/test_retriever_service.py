"""The retriever service on the real MiniLM, the real Qdrant engine and real HTTP."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import httpx
import numpy as np
import pytest
import torch

from services.cli.ingest import ingest_file
from services.common.checkpoints import publish_checkpoint, staging_dir
from services.common.clients.retriever import RetrieverClient, ServiceError
from services.modeling.encoder import SentenceEncoder

pytestmark = pytest.mark.slow

# Measured on the shared hotpotqa set (350 questions, greedy top-5 over its 4,858 passages):
# 0.796 recall@5 of supporting docs with base all-MiniLM-L6-v2 in bf16. The floor leaves room for noise.
RECALL_AT_5_FLOOR = 0.75


@pytest.fixture(scope="module")
def hotpot(retriever_factory, shared_data):
    service = retriever_factory("hotpot")
    client = RetrieverClient(service.url, admin_token=service.token, timeout=600)
    report = ingest_file(client, shared_data / "corpus" / "hotpotqa.jsonl", progress=False)
    assert report["upserted"] == report["documents"] == 4858
    yield service, client
    client.close()


def load_questions(shared_data: Path) -> list[dict]:
    return [json.loads(line) for line in (shared_data / "qa" / "hotpotqa.jsonl").open()]


def recall_at_k(client: RetrieverClient, questions: list[dict], k: int) -> float:
    recalls = []
    for start in range(0, len(questions), 64):
        batch = questions[start : start + 64]
        response = client.search([q["question"] for q in batch], top_k=k, candidates=max(k, 20))
        for q, result in zip(batch, response.results, strict=True):
            gold = set(q["metadata"]["supporting_doc_ids"])
            recalls.append(len(gold & {d.id for d in result.docs}) / len(gold))
    return float(np.mean(recalls))


def test_recall_at_5_of_supporting_docs(hotpot, shared_data):
    _, client = hotpot
    recall = recall_at_k(client, load_questions(shared_data), 5)
    print(f"\nhotpotqa recall@5 (base MiniLM): {recall:.3f}")
    assert recall >= RECALL_AT_5_FLOOR


def test_reingest_is_idempotent(hotpot, shared_data, tmp_path):
    service, client = hotpot
    head = tmp_path / "head.jsonl"
    head.write_text("".join((shared_data / "corpus" / "hotpotqa.jsonl").read_text().splitlines(True)[:300]))
    report = ingest_file(client, head, progress=False)
    assert report == {"file": str(head), "documents": 300, "upserted": 0, "unchanged": 300}
    assert httpx.get(service.url + "/readyz").json()["documents"] == 4858


def plackett_luce_torch(scores: list[float], chosen: list[int], temperature: float) -> float:
    """Independent recomputation: product of softmaxes over the not-yet-chosen candidates."""
    logits = torch.tensor(scores, dtype=torch.float64) / temperature
    available = torch.ones(len(scores), dtype=torch.bool)
    total = torch.tensor(0.0, dtype=torch.float64)
    for idx in chosen:
        total = total + torch.log_softmax(logits.masked_fill(~available, float("-inf")), dim=0)[idx]
        available[idx] = False
    return float(total)


def test_sampled_search_is_reproducible_and_its_logprob_checks_out(hotpot, shared_data):
    _, client = hotpot
    queries = [q["question"] for q in load_questions(shared_data)[:8]]
    params = {"top_k": 3, "candidates": 20, "mode": "sample", "temperature": 0.05}
    first = client.search(queries, seed=7, **params)
    again = client.search(queries, seed=7, **params)
    other = client.search(queries, seed=8, **params)
    assert [[d.id for d in r.docs] for r in first.results] == [[d.id for d in r.docs] for r in again.results]
    assert [r.logprob for r in first.results] == [r.logprob for r in again.results]
    assert [[d.id for d in r.docs] for r in first.results] != [[d.id for d in r.docs] for r in other.results]
    # A query's draw does not depend on its batch-mates.
    alone = client.search(queries[:1], seed=7, **params)
    assert [d.id for d in alone.results[0].docs] == [d.id for d in first.results[0].docs]
    for result in first.results:
        ids = [c.id for c in result.candidates]
        chosen = [ids.index(d.id) for d in result.docs]
        expected = plackett_luce_torch([c.score for c in result.candidates], chosen, params["temperature"])
        assert result.logprob == pytest.approx(expected, abs=1e-6)
        assert result.logprob < 0


def test_greedy_search_shape(hotpot):
    _, client = hotpot
    response = client.search(["Who wrote Animorphs?", "capital of France"], top_k=4, candidates=10)
    assert response.retriever_version == "base"
    assert [r.query for r in response.results] == ["Who wrote Animorphs?", "capital of France"]
    for result in response.results:
        assert len(result.docs) == 4 and len(result.candidates) == 10
        assert result.logprob is None
        scores = [c.score for c in result.candidates]
        assert scores == sorted(scores, reverse=True)
        assert [d.id for d in result.docs] == [c.id for c in result.candidates[:4]]


def test_search_r1_retrieve_endpoint(hotpot):
    service, _ = hotpot
    body = {"queries": ["Animorphs science fantasy series"], "topk": 2, "return_scores": True}
    scored = httpx.post(service.url + "/retrieve", json=body).json()["result"]
    assert len(scored) == 1 and len(scored[0]) == 2
    assert set(scored[0][0]) == {"document", "score"}
    assert set(scored[0][0]["document"]) == {"id", "contents"}
    title, _, text = scored[0][0]["document"]["contents"].partition("\n")
    assert title and text
    bare = httpx.post(service.url + "/retrieve", json={**body, "return_scores": False}).json()["result"]
    assert bare[0] == [item["document"] for item in scored[0]]


def write_query_checkpoint(service, model_dir: Path, version: str, noise: float, seed: int = 0) -> str:
    """A perturbed copy of the base query tower, written the way the trainer writes one."""
    root = service.data_dir / "checkpoints"
    encoder = SentenceEncoder.from_pretrained(model_dir)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for param in encoder.model.parameters():
            param.add_(torch.randn(param.shape, generator=generator) * noise * param.std().clamp(min=1e-3))
    staging = staging_dir(root, version)
    encoder.save_weights(staging / "query_encoder.safetensors")
    publish_checkpoint(staging, root / version, kind="retriever-query", version=version, parent="base")
    return version


def test_query_tower_hot_swap_under_load_and_rollback(hotpot, shared_data, models_root):
    service, client = hotpot
    version = write_query_checkpoint(service, models_root / "all-MiniLM-L6-v2", "q-perturbed", noise=0.3)
    manifest = client.register(version)
    assert manifest.version == version and manifest.kind == "retriever-query"
    questions = [q["question"] for q in load_questions(shared_data)[:16]]
    before = client.search(questions, top_k=5, candidates=20)

    failures: list[str] = []
    seen: list[str] = []
    stop = threading.Event()

    def hammer(worker: int) -> None:
        with httpx.Client(base_url=service.url, timeout=60) as http:
            i = worker
            while not stop.is_set():
                response = http.post("/v1/search", json={"queries": [questions[i % 16]], "top_k": 3})
                if response.status_code != 200:
                    failures.append(f"{response.status_code}: {response.text}")
                else:
                    seen.append(response.json()["retriever_version"])
                i += 1

    threads = [threading.Thread(target=hammer, args=(w,)) for w in range(8)]
    for t in threads:
        t.start()
    try:
        while len(seen) < 40:
            threading.Event().wait(0.05)
        activation = client.activate(version)
        count_at_swap = len(seen)
        while len(seen) < count_at_swap + 40:
            threading.Event().wait(0.05)
    finally:
        stop.set()
        for t in threads:
            t.join()
    assert activation.status == "active" and activation.active == version and activation.previous == "base"
    assert failures == []
    assert set(seen) == {"base", version}
    assert seen[-1] == version

    after = client.search(questions, top_k=5, candidates=20)
    assert after.retriever_version == version
    assert [[c.score for c in r.candidates] for r in after.results] != [
        [c.score for c in r.candidates] for r in before.results
    ]
    listing = client.checkpoints()
    assert listing.active == version and listing.previous == "base"
    assert {c.version for c in listing.checkpoints} >= {"base", version}

    rolled = client.rollback()
    assert rolled.active == "base" and rolled.previous == version
    restored = client.search(questions, top_k=5, candidates=20)
    assert restored.retriever_version == "base"
    assert [[d.id for d in r.docs] for r in restored.results] == [[d.id for d in r.docs] for r in before.results]


def test_wrong_sha256_is_refused_and_active_version_unchanged(hotpot, models_root):
    service, client = hotpot
    active_before = client.checkpoints().active
    version = write_query_checkpoint(service, models_root / "all-MiniLM-L6-v2", "q-corrupt", noise=0.1, seed=1)
    weights = service.data_dir / "checkpoints" / version / "query_encoder.safetensors"
    data = bytearray(weights.read_bytes())
    data[-1] ^= 0xFF
    weights.write_bytes(bytes(data))
    with pytest.raises(ServiceError) as err:
        client.register(version)
    assert err.value.status_code == 400 and "sha256" in err.value.detail
    listing = client.checkpoints()
    assert listing.active == active_before
    assert version not in {c.version for c in listing.checkpoints}
    with pytest.raises(ServiceError) as err:
        client.activate(version)
    assert err.value.status_code == 404


def test_a_hashed_payload_that_is_not_safetensors_is_a_400_not_a_500(hotpot):
    """The manifest vouches for the bytes, not for what they are: loading them must refuse with the reason."""
    service, client = hotpot
    active_before = client.checkpoints().active
    root = service.data_dir / "checkpoints"
    staging = staging_dir(root, "q-not-safetensors")
    (staging / "query_encoder.safetensors").write_bytes(b"\x08\x00\x00\x00\x00\x00\x00\x00not json")
    publish_checkpoint(staging, root / "q-not-safetensors", kind="retriever-query", version="q-not-safetensors",
                       parent="base")  # fmt: skip
    with pytest.raises(ServiceError) as err:
        client.register("q-not-safetensors")
        client.activate("q-not-safetensors")
    assert err.value.status_code == 400 and "not a safetensors file" in err.value.detail
    assert client.checkpoints().active == active_before


def test_one_search_may_not_hold_the_search_thread_for_long(hotpot):
    """256 queries of 2,000 characters held the one search thread for 49 s: the characters of one request are
    bounded (128,000 by default), with the reason, and a request within the bound is served."""
    service, _ = hotpot
    heavy = {"queries": ["film director born " * 100] * 100}  # 190,000 characters
    refused = httpx.post(service.url + "/v1/search", json=heavy, timeout=60)
    assert refused.status_code == 400 and "at most 128000" in refused.json()["detail"], refused.text
    assert refused.json()["error"]["code"] == "too_much_work"
    legacy = httpx.post(service.url + "/retrieve", json={"queries": heavy["queries"], "topk": 3}, timeout=60)
    assert legacy.status_code == 400  # Search-R1's route goes through the same bound
    fine = httpx.post(service.url + "/v1/search", json={"queries": ["film director born " * 50] * 8}, timeout=120)
    assert fine.status_code == 200


def test_checkpoint_path_outside_root_is_refused(hotpot):
    _, client = hotpot
    for path in ["../../etc", "/etc", "../registry.json"]:
        with pytest.raises(ServiceError) as err:
            client.register(path)
        assert err.value.status_code == 400 and "checkpoint root" in err.value.detail


def test_admin_endpoints_need_the_token(hotpot):
    service, _ = hotpot
    doc = {"documents": [{"id": "x-1", "title": "t", "text": "some text"}]}
    missing = httpx.post(service.url + "/v1/documents", json=doc)
    assert missing.status_code == 401 and "Bearer" in missing.json()["detail"]
    wrong = httpx.post(service.url + "/v1/documents", json=doc, headers={"Authorization": "Bearer nope"})
    assert wrong.status_code == 403
    assert httpx.post(service.url + "/v1/checkpoints/rollback").status_code == 401


def test_document_upsert_get_delete(hotpot):
    service, client = hotpot
    from services.common.schemas.retriever import Document

    doc = Document(id="custom-doc-1", title="Zorblax", text="Zorblax is a fictional moon of the planet Quux.")
    assert client.upsert([doc]).upserted == 1
    assert client.get_document("custom-doc-1") == doc
    top = client.search(["Which planet does Zorblax orbit?"], top_k=1, candidates=5).results[0].docs[0]
    assert top.id == "custom-doc-1"
    client.delete_document("custom-doc-1")
    with pytest.raises(ServiceError) as err:
        client.get_document("custom-doc-1")
    assert err.value.status_code == 404
    assert (
        httpx.delete(
            service.url + "/v1/documents/custom-doc-1", headers={"Authorization": f"Bearer {service.token}"}
        ).status_code
        == 404
    )


def test_document_lookup_many_in_one_call(hotpot, shared_data):
    service, client = hotpot
    with (shared_data / "corpus" / "hotpotqa.jsonl").open() as fh:
        ids = [json.loads(line)["id"] for line, _ in zip(fh, range(1100), strict=False)]
    docs = client.get_documents(ids)  # two bounded calls (1,024 + 76)
    assert list(docs) == ids and docs[ids[5]] == client.get_document(ids[5])
    body = httpx.post(service.url + "/v1/documents/lookup", json={"ids": [ids[0], "no-such-doc", ids[0]]}).json()
    assert [d["id"] for d in body["documents"]] == [ids[0]] and body["missing"] == ["no-such-doc"]
    for bad in ([], ids):  # none, or more than 1,024
        response = httpx.post(service.url + "/v1/documents/lookup", json={"ids": bad})
        assert 400 <= response.status_code < 500 and "ids" in response.json()["detail"]
    with pytest.raises(KeyError):
        client.get_documents(["no-such-doc"])


@pytest.mark.parametrize(
    ("body", "reason"),
    [
        (b"", "body"),
        (b"{not json", "JSON"),
        (b"{}", "queries"),
        (b'{"queries": []}', "queries"),
        (b'{"queries": [""]}', "queries"),
        (b'{"queries": ["a"], "top_k": 0}', "top_k"),
        (b'{"queries": ["a"], "top_k": 30, "candidates": 20}', "top_k"),
        (b'{"queries": ["a"], "mode": "random"}', "mode"),
        (b'{"queries": ["a"], "temperature": 0}', "temperature"),
        (b'{"queries": ["a"], "bogus": 1}', "bogus"),
        (json.dumps({"queries": ["q"] * 257}).encode(), "queries"),
        (json.dumps({"queries": ["x" * 2001]}).encode(), "queries"),
    ],
)
def test_bad_search_bodies_get_4xx_with_a_reason(hotpot, body, reason):
    service, _ = hotpot
    response = httpx.post(service.url + "/v1/search", content=body, headers={"content-type": "application/json"})
    assert 400 <= response.status_code < 500, response.text
    assert reason.lower() in response.json()["detail"].lower()
    assert httpx.get(service.url + "/healthz").status_code == 200


def test_oversized_body_is_refused_with_413(hotpot):
    service, _ = hotpot
    huge = json.dumps({"queries": ["y" * 1000] * 10_000}).encode()  # ~10 MB, over the 8 MiB limit
    response = httpx.post(service.url + "/v1/search", content=huge, headers={"content-type": "application/json"})
    assert response.status_code == 413 and "exceeds" in response.json()["detail"]
    assert httpx.get(service.url + "/readyz").status_code == 200


def test_metrics_are_exposed(hotpot):
    service, _ = hotpot
    text = httpx.get(service.url + "/metrics").text
    assert "bridge_retriever_search_seconds" in text
    assert 'bridge_retriever_active_version_info{version="base"} 1.0' in text
    text = httpx.get(service.url + "/metrics").text  # the first scrape is counted and timed under its route
    assert 'bridge_retriever_request_duration_seconds_count{handler="/metrics",method="GET",status="200"}' in text
    assert 'bridge_retriever_requests_total{handler="/metrics",method="GET",status="200"}' in text


def test_micro_batch_sizes_are_counted(hotpot):
    """One request of three queries is one micro-batch of three in `bridge_retriever_batch_queries` (what
    bench.retriever reads as queries per forward)."""
    from bench.retriever import micro_batches

    service, _ = hotpot
    queries_before, batches_before = micro_batches(service.url)
    response = httpx.post(service.url + "/v1/search", json={"queries": ["who", "what", "where"], "top_k": 2})
    assert response.status_code == 200
    queries_after, batches_after = micro_batches(service.url)
    assert (queries_after - queries_before, batches_after - batches_before) == (3.0, 1.0)
