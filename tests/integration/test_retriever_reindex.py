"""A checkpoint with a new document tower re-embeds the corpus in the background, then flips with the encoder."""

from __future__ import annotations

import json
import threading
import time

import httpx
import pytest
import torch

from services.cli.ingest import ingest_file
from services.common.checkpoints import publish_checkpoint, staging_dir
from services.common.clients.retriever import RetrieverClient
from services.modeling.encoder import SentenceEncoder

pytestmark = pytest.mark.slow


def test_doc_tower_checkpoint_reembeds_then_flips(retriever_factory, shared_data, models_root, tmp_path):
    service = retriever_factory("reindex")
    client = RetrieverClient(service.url, admin_token=service.token, timeout=600)
    corpus = tmp_path / "small.jsonl"
    corpus.write_text("".join((shared_data / "corpus" / "nq.jsonl").read_text().splitlines(True)[:400]))
    ingest_file(client, corpus, progress=False)
    question = json.loads((shared_data / "qa" / "nq.jsonl").read_text().splitlines()[0])["question"]
    before = client.search([question], top_k=3, candidates=10)

    # A new document tower and a new query tower, as a full retriever checkpoint.
    root = service.data_dir / "checkpoints"
    staging = staging_dir(root, "full-1")
    for name, seed in (("query_encoder.safetensors", 1), ("doc_encoder.safetensors", 2)):
        encoder = SentenceEncoder.from_pretrained(models_root / "all-MiniLM-L6-v2")
        generator = torch.Generator().manual_seed(seed)
        with torch.no_grad():
            for param in encoder.model.parameters():
                param.add_(torch.randn(param.shape, generator=generator) * 0.2 * param.std().clamp(min=1e-3))
        encoder.save_weights(staging / name)
    publish_checkpoint(staging, root / "full-1", kind="retriever-full", version="full-1", parent="base")
    client.register("full-1")
    assert {c.version: c.state for c in client.checkpoints().checkpoints} == {"base": "ready", "full-1": "pending"}

    versions: list[str] = []
    failures: list[int] = []
    stop = threading.Event()

    def query_loop() -> None:
        with httpx.Client(base_url=service.url, timeout=60) as http:
            while not stop.is_set():
                response = http.post("/v1/search", json={"queries": [question], "top_k": 3})
                if response.status_code == 200:
                    versions.append(response.json()["retriever_version"])
                else:
                    failures.append(response.status_code)

    thread = threading.Thread(target=query_loop)
    thread.start()
    try:
        activation = client.activate("full-1")
        assert activation.status == "reindexing" and activation.active == "base" and activation.pending == "full-1"
        deadline = time.monotonic() + 120
        while client.checkpoints().active != "full-1":
            assert time.monotonic() < deadline, "re-embedding did not finish"
            time.sleep(0.2)
    finally:
        stop.set()
        thread.join()
    assert failures == []
    assert versions[0] == "base" and set(versions) <= {"base", "full-1"}
    # Versions only ever move forward: the old pair serves until the flip, the new one after.
    flip = versions.index("full-1") if "full-1" in versions else len(versions)
    assert all(v == "base" for v in versions[:flip]) and all(v == "full-1" for v in versions[flip:])

    assert {(c.version, c.state, c.error) for c in client.checkpoints().checkpoints} == {
        ("base", "ready", None), ("full-1", "ready", None),
    }  # fmt: skip
    after = client.search([question], top_k=3, candidates=10)
    assert after.retriever_version == "full-1"
    assert [c.score for c in after.results[0].candidates] != [c.score for c in before.results[0].candidates]
    assert httpx.get(service.url + "/readyz").json()["documents"] == 400

    # Rolling back to base serves the base pair (its collection was kept) without re-embedding.
    rolled = client.rollback()
    assert rolled.status == "active" and rolled.active == "base"
    again = client.search([question], top_k=3, candidates=10)
    assert [d.id for d in again.results[0].docs] == [d.id for d in before.results[0].docs]
    client.close()
