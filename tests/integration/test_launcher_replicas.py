"""`bridge-rl up --retriever-replicas 2`'s retriever (Stack.start_retriever): two real retriever processes in one
replica group, each with its own embedded index, behind HAProxy on the stack's retriever port. A document ingested
at that port reaches both, a checkpoint activated there flips both, and stop() leaves nothing running."""

from __future__ import annotations

import os
from types import SimpleNamespace

import httpx
import pytest

from services.cli.balancer import haproxy_binary
from services.cli.launcher import Stack, free_port
from services.common.settings import CommonSettings
from tests.integration.test_retriever_service import write_query_checkpoint

REDIS = os.environ.get("BRIDGE_TEST_REDIS_URL", "redis://127.0.0.1:6379/0")

try:
    haproxy_binary()
except FileNotFoundError:
    pytestmark = pytest.mark.skip(reason="haproxy is not installed (.ci/run installs Debian's)")


def test_the_launchers_replicas_share_writes_and_swap_as_one(tmp_path, models_root, monkeypatch):
    monkeypatch.setenv("BRIDGE_RETRIEVER_ENCODER_DIR", str(models_root / "all-MiniLM-L6-v2"))
    settings = CommonSettings(data_dir=tmp_path / "data", redis_url=REDIS)
    stack = Stack(settings, retriever_port=free_port(), retriever_replicas=2, report=lambda line: None)
    stack.start_redis()
    try:
        stack.start_retriever()
        names = [name for name, _ in stack.processes]
        assert names == ["retriever-r0", "retriever-r1", "balancer"]
        admin = {"Authorization": f"Bearer {settings.resolve_admin_token()}"}
        doc = {"id": "d1", "title": "Hamlet", "text": "Hamlet is a tragedy written by William Shakespeare."}
        r = httpx.post(stack.retriever_url + "/v1/documents", json={"documents": [doc]}, headers=admin, timeout=60)
        assert r.json() == {"upserted": 1, "unchanged": 0, "replicas_behind": []}, r.text
        for n in range(2):  # each replica's own index, in its own state dir
            assert (settings.data_dir / "retriever-replicas" / f"r{n}" / "qdrant-edge").is_dir()
        version = write_query_checkpoint(SimpleNamespace(data_dir=settings.data_dir), models_root / "all-MiniLM-L6-v2",
                                         "q-launcher", noise=0.3)  # fmt: skip
        assert httpx.post(stack.retriever_url + "/v1/checkpoints", json={"path": version}, headers=admin,
                          timeout=120).is_success  # fmt: skip
        swap = httpx.post(f"{stack.retriever_url}/v1/checkpoints/{version}/activate", headers=admin, timeout=120)
        assert swap.json()["replicas"] == {"r0": "committed", "r1": "committed"}, swap.text
        for _ in range(4):  # round robin: both replicas answer, each at the new version, with the document
            found = httpx.post(stack.retriever_url + "/v1/search", json={"queries": ["Who wrote Hamlet?"], "top_k": 1},
                               timeout=60).json()  # fmt: skip
            assert found["retriever_version"] == version and found["results"][0]["docs"][0]["id"] == "d1"
    finally:
        processes = [process for _, process in stack.processes]
        stack.stop()
    assert all(process.poll() is not None for process in processes)
    with pytest.raises(httpx.TransportError):
        httpx.get(stack.retriever_url + "/readyz", timeout=2)
