"""A document-tower checkpoint whose re-embed fails shows state 'failed' and the reason in GET /v1/checkpoints,
refuses activation with a 409 that says why, and leaves the service serving the previous version."""

from __future__ import annotations

import json
import time

import httpx
import pytest
import torch

from services.cli.ingest import ingest_file
from services.common.checkpoints import publish_checkpoint, staging_dir
from services.common.clients.retriever import RetrieverClient, ServiceError
from services.modeling.encoder import SentenceEncoder
from tests.conftest import REPO

pytestmark = pytest.mark.slow


def _entry(client: RetrieverClient, version: str):
    [entry] = [c for c in client.checkpoints().checkpoints if c.version == version]
    return entry


def test_a_doc_tower_with_nan_weights_fails_its_reembed_visibly(retriever_factory, models_root, tmp_path):
    service = retriever_factory("reembed-fail")
    client = RetrieverClient(service.url, admin_token=service.token, timeout=600)
    corpus = tmp_path / "small.jsonl"
    corpus.write_text("".join((REPO / "services/demo_data/hotpotqa_corpus.jsonl").read_text().splitlines(True)[:120]))
    ingest_file(client, corpus, progress=False)
    question = "Which award is presented by the Science Fiction and Fantasy Writers of America?"
    before = client.search([question], top_k=3, candidates=10)

    # A diverged training run: a document tower whose weights load (right keys and shapes) but hold NaN, so every
    # vector it encodes is NaN. The index would store those and never return the passages again.
    root = service.data_dir / "checkpoints"
    staging = staging_dir(root, "full-nan")
    encoder = SentenceEncoder.from_pretrained(models_root / "all-MiniLM-L6-v2")
    encoder.save_weights(staging / "query_encoder.safetensors")
    with torch.no_grad():
        dict(encoder.model.named_parameters())["encoder.layer.0.attention.self.query.weight"].fill_(float("nan"))
    encoder.save_weights(staging / "doc_encoder.safetensors")
    publish_checkpoint(staging, root / "full-nan", kind="retriever-full", version="full-nan", parent="base")
    client.register("full-nan")
    assert _entry(client, "full-nan").state == "pending" and _entry(client, "base").state == "ready"

    activation = client.activate("full-nan")
    assert activation.status == "reindexing" and activation.pending == "full-nan"
    deadline = time.monotonic() + 120
    while (listing := client.checkpoints()).pending is not None:
        assert time.monotonic() < deadline, "re-embed neither finished nor failed:\n" + service.log_tail()
        time.sleep(0.2)
    assert listing.active == "base"
    failed = _entry(client, "full-nan")
    assert failed.state == "failed"
    assert "non-finite vectors" in failed.error and "120 of 120" in failed.error
    raw = httpx.get(service.url + "/v1/checkpoints").json()  # on the wire, as any client sees it
    assert {"version": "full-nan", "state": "failed"}.items() <= next(
        c for c in raw["checkpoints"] if c["version"] == "full-nan"
    ).items()

    # Recorded in the registry file, so a restarted service still knows.
    registry = json.loads((service.data_dir / "retriever" / "registry.json").read_text())
    assert registry["checkpoints"]["full-nan"]["state"] == "failed"
    assert "non-finite" in registry["checkpoints"]["full-nan"]["error"]

    # Activating it again answers 409 with the reason, and so does a query-only child that would need its collection.
    with pytest.raises(ServiceError) as info:
        client.activate("full-nan")
    assert info.value.status_code == 409 and "non-finite vectors" in info.value.detail
    staging = staging_dir(root, "child")
    SentenceEncoder.from_pretrained(models_root / "all-MiniLM-L6-v2").save_weights(
        staging / "query_encoder.safetensors"
    )
    publish_checkpoint(staging, root / "child", kind="retriever-query", version="child", parent="full-nan")
    client.register("child")
    assert _entry(client, "child").state == "failed"
    with pytest.raises(ServiceError) as info:
        client.activate("child")
    assert info.value.status_code == 409 and "non-finite vectors" in info.value.detail

    # The service still serves the base version, with the same answers as before.
    after = client.search([question], top_k=3, candidates=10)
    assert after.retriever_version == "base"
    assert [d.id for d in after.results[0].docs] == [d.id for d in before.results[0].docs]
    assert httpx.get(service.url + "/readyz").json()["documents"] == 120
    client.close()
