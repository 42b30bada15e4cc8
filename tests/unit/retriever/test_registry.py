"""The retriever's registry file: checkpoint states round-trip, and a file written before states existed loads with
each checkpoint's state derived from whether its collection was built."""

from __future__ import annotations

import json

from services.retriever.backends.index import EdgeIndex
from services.retriever.registry import RegistryState, RetrieverCheckpoint
from services.retriever.service import RetrieverService
from services.retriever.settings import RetrieverSettings


def test_a_fresh_registry_has_a_ready_base(tmp_path):
    state = RegistryState.load(tmp_path / "registry.json")
    assert state.checkpoints["base"].state == "ready" and state.checkpoints["base"].error is None


def test_states_and_errors_round_trip(tmp_path):
    path = tmp_path / "registry.json"
    state = RegistryState.load(path)
    state.checkpoints["full-1"] = RetrieverCheckpoint(
        version="full-1", kind="retriever-full", parent="base", path="/x", doc_tower="full-1", state="failed",
        error="ReembedFailed: the document tower gave non-finite vectors for 3 of 3 passages",
    )  # fmt: skip
    state.save(path)
    again = RegistryState.load(path)
    assert again.checkpoints["full-1"].state == "failed"
    assert again.checkpoints["full-1"].error.startswith("ReembedFailed: ")


def test_a_registry_from_before_states_derives_them_from_the_built_collections(tmp_path):
    path = tmp_path / "registry.json"
    entry = {"kind": "retriever-full", "parent": "base", "created_at": None, "path": "/x"}
    path.write_text(json.dumps({
        "active": "full-1", "previous": "base", "complete_collections": ["docs-base", "docs-full-1"],
        "checkpoints": {
            "base": {"version": "base", "kind": "retriever-base", "doc_tower": "base"},
            "full-1": {"version": "full-1", **entry, "doc_tower": "full-1"},
            "q-1": {"version": "q-1", "kind": "retriever-query", "parent": "full-1", "doc_tower": "full-1"},
            "full-2": {"version": "full-2", **entry, "doc_tower": "full-2"},  # registered, never embedded
        },
    }))  # fmt: skip
    state = RegistryState.load(path)
    assert {v: c.state for v, c in state.checkpoints.items()} == {
        "base": "ready", "full-1": "ready", "q-1": "ready", "full-2": "pending",
    }  # fmt: skip
    assert [c.version for c in state.same_doc_tower("q-1")] == ["full-1", "q-1"]


def test_the_service_keeps_as_many_pinned_versions_as_its_settings_say(tmp_path):
    encoder = tmp_path / "encoder"
    encoder.mkdir()
    (encoder / "config.json").write_text("{}")  # constructing the service loads nothing; `start` would
    index = EdgeIndex(tmp_path / "edge")
    try:
        assert RetrieverSettings(data_dir=tmp_path).pinned_versions == 2
        settings = RetrieverSettings(data_dir=tmp_path, encoder_dir=str(encoder), pinned_versions=3)
        assert RetrieverService(settings, index).checkpoints.keep_pinned == 3
    finally:
        index.close()
