"""Encoder settings on the real MiniLM: query/passage prefixes (or an instruction), pooling (mean / CLS),
normalisation, and the preset (e5, BGE, MiniLM) chosen from the model folder's name or its sentence-transformers
files, each overridable."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from services.modeling.encoder import PRESETS, EncoderConfig, SentenceEncoder, encoder_config

QUERIES = ["who wrote hamlet", "what is the boiling point of water at sea level in kelvin"]
PASSAGES = ["Hamlet is a tragedy written by William Shakespeare.", "Water boils at 373.15 K at sea level."]
WEIGHT_FILES = ["config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json", "vocab.txt",
                "special_tokens_map.json"]  # fmt: skip


@pytest.fixture(scope="module")
def minilm(models_root) -> Path:
    return models_root / "all-MiniLM-L6-v2"


def bare_copy(minilm: Path, folder: Path, **files: dict | list) -> Path:
    """The MiniLM weights under another folder name, without its sentence-transformers files unless given."""
    folder.mkdir(parents=True)
    for name in WEIGHT_FILES:
        (folder / name).symlink_to(minilm / name)
    for name, content in files.items():
        path = folder / name.replace("__", "/")
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(content))
    return folder


def test_the_shipped_minilm_is_mean_pooled_normalised_and_unprefixed(minilm):
    config = encoder_config(minilm)
    assert config == EncoderConfig(preset="minilm", query_prefix="", passage_prefix="", pooling="mean",
                                   normalize=True)  # fmt: skip


def test_prefixes_change_the_vectors_exactly_as_encoding_the_prefixed_string(minilm):
    plain = SentenceEncoder.from_pretrained(minilm)
    prefixed = SentenceEncoder.from_pretrained(minilm, query_prefix="query: ", passage_prefix="passage: ")
    np.testing.assert_allclose(prefixed.encode(QUERIES, kind="query"),
                               plain.encode(["query: " + q for q in QUERIES], kind="query"), atol=1e-6)  # fmt: skip
    passages = plain.encode(["passage: " + p for p in PASSAGES], kind="passage")
    np.testing.assert_allclose(prefixed.encode(PASSAGES, kind="passage"), passages, atol=1e-6)
    # the trainer's differentiable query path (forward) prefixes too
    with torch.inference_mode():
        np.testing.assert_allclose(prefixed(QUERIES).numpy(), plain(["query: " + q for q in QUERIES]).numpy(),
                                   atol=1e-5)  # fmt: skip
    # on vs off: not the same vectors, and each side gets its own prefix
    assert not np.allclose(prefixed.encode(QUERIES, kind="query"), plain.encode(QUERIES, kind="query"), atol=1e-3)
    assert not np.allclose(prefixed.encode(QUERIES, kind="query"), prefixed.encode(QUERIES, kind="passage"),
                           atol=1e-3)  # fmt: skip


def test_cls_pooling_is_the_first_tokens_hidden_state_and_differs_from_mean(minilm):
    cls_raw = SentenceEncoder.from_pretrained(minilm, pooling="cls", normalize=False)
    mean_raw = SentenceEncoder.from_pretrained(minilm, pooling="mean", normalize=False)
    with torch.inference_mode():
        batch = cls_raw.tokenize(PASSAGES)
        first_token = cls_raw.model(**batch).last_hidden_state[:, 0]  # (B, H)
        np.testing.assert_allclose(cls_raw(PASSAGES).numpy(), first_token.numpy(), atol=1e-6)
        np.testing.assert_allclose(cls_raw.encode(PASSAGES, kind="passage"), first_token.numpy(), atol=1e-5)
        assert not np.allclose(cls_raw(PASSAGES).numpy(), mean_raw(PASSAGES).numpy(), atol=1e-2)
        normalised = SentenceEncoder.from_pretrained(minilm, pooling="cls")(PASSAGES).numpy()
    np.testing.assert_allclose(normalised, torch.nn.functional.normalize(first_token, dim=-1).numpy(), atol=1e-6)
    assert np.linalg.norm(cls_raw.encode(PASSAGES), axis=1) == pytest.approx(
        torch.linalg.norm(first_token, dim=-1).numpy(), rel=1e-5)  # fmt: skip


@pytest.mark.parametrize(
    ("name", "preset"),
    [("e5-base-v2", "e5"), ("multilingual-e5-small", "e5"), ("bge-small-en-v1.5", "bge"),
     ("all-MiniLM-L12-v2", "minilm")],
)  # fmt: skip
def test_the_preset_is_chosen_from_the_folder_name(minilm, tmp_path, name, preset):
    folder = bare_copy(minilm, tmp_path / name)
    encoder = SentenceEncoder.from_pretrained(folder)
    assert encoder.config == PRESETS[preset].model_copy(update={"preset": preset})


def test_presets_say_what_each_model_family_was_trained_with():
    assert (PRESETS["e5"].query_prefix, PRESETS["e5"].passage_prefix, PRESETS["e5"].pooling) == (
        "query: ", "passage: ", "mean")  # fmt: skip
    bge = PRESETS["bge"]
    assert (bge.query_prefix, bge.passage_prefix, bge.pooling) == (
        "Represent this sentence for searching relevant passages: ", "", "cls")  # fmt: skip
    assert (PRESETS["minilm"].query_prefix, PRESETS["minilm"].pooling) == ("", "mean")


def test_a_bge_folder_encodes_queries_with_the_instruction_and_cls(minilm, tmp_path):
    bge = SentenceEncoder.from_pretrained(bare_copy(minilm, tmp_path / "bge-base-en-v1.5"))
    plain_cls = SentenceEncoder.from_pretrained(minilm, pooling="cls")
    instruction = PRESETS["bge"].query_prefix
    np.testing.assert_allclose(bge.encode(QUERIES, kind="query"),
                               plain_cls.encode([instruction + q for q in QUERIES]), atol=1e-6)  # fmt: skip
    np.testing.assert_allclose(bge.encode(PASSAGES, kind="passage"), plain_cls.encode(PASSAGES, kind="passage"),
                               atol=1e-6)  # fmt: skip


def test_an_unnamed_folder_is_read_from_its_config_and_sentence_transformers_files(minilm, tmp_path):
    by_config = bare_copy(minilm, tmp_path / "renamed")
    config = json.loads((minilm / "config.json").read_text())
    (by_config / "config.json").unlink()
    (by_config / "config.json").write_text(json.dumps({**config, "_name_or_path": "intfloat/e5-base-v2"}))
    assert encoder_config(by_config).preset == "e5"
    st_files = bare_copy(
        minilm, tmp_path / "my-encoder",
        **{"1_Pooling__config.json": {"pooling_mode_cls_token": True, "pooling_mode_mean_tokens": False},
           "modules.json": [{"idx": 0, "path": "", "type": "sentence_transformers.models.Transformer"},
                            {"idx": 1, "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"}],
           "config_sentence_transformers.json": {"prompts": {"query": "q> ", "document": "d> "}}},
    )  # fmt: skip
    assert encoder_config(st_files) == EncoderConfig(preset="minilm", query_prefix="q> ", passage_prefix="d> ",
                                                     pooling="cls", normalize=False)  # fmt: skip


def test_settings_override_the_preset(minilm, tmp_path):
    folder = bare_copy(minilm, tmp_path / "e5-small-v2")
    config = encoder_config(folder, query_prefix="", pooling="cls", normalize=False)
    assert config == EncoderConfig(preset="e5", query_prefix="", passage_prefix="passage: ", pooling="cls",
                                   normalize=False)  # fmt: skip
    with pytest.raises(ValueError, match="pooling"):
        encoder_config(folder, pooling="max")


def test_the_retriever_service_applies_the_settings_to_both_towers(minilm, tmp_path, monkeypatch):
    """BRIDGE_ENCODER_* reach the service: its stored passage vectors are the passage-prefixed encoding and its
    search scores the query-prefixed one against them."""
    import asyncio

    from services.retriever.inprocess import InProcessRetriever

    monkeypatch.setenv("BRIDGE_ENCODER_QUERY_PREFIX", "query: ")
    monkeypatch.setenv("BRIDGE_ENCODER_PASSAGE_PREFIX", "passage: ")
    monkeypatch.setenv("BRIDGE_ENCODER_POOLING", "cls")
    monkeypatch.setenv("BRIDGE_RETRIEVER_DTYPE", "float32")
    corpus = tmp_path / "corpus.jsonl"
    rows = [{"id": f"p{i}", "title": "", "text": text} for i, text in enumerate(PASSAGES)]
    corpus.write_text("".join(json.dumps(row) + "\n" for row in rows))

    async def run():
        async with InProcessRetriever(tmp_path / "data", encoder_dir=minilm) as retriever:
            active = retriever.service.active
            await retriever.ingest([corpus])
            return active, await retriever.search([QUERIES[0]], top_k=2, candidates=2)

    active, response = asyncio.run(run())
    expected = EncoderConfig(preset="minilm", query_prefix="query: ", passage_prefix="passage: ", pooling="cls",
                             normalize=True)  # fmt: skip
    assert active.query_encoder.config == expected and active.doc_encoder.config == expected
    plain = SentenceEncoder.from_pretrained(minilm, pooling="cls")
    query = plain.encode(["query: " + QUERIES[0]])[0]
    passages = plain.encode(["passage: " + p for p in PASSAGES])
    scores = {d.id: d.score for d in response.results[0].docs}
    assert scores == pytest.approx({"p0": float(passages[0] @ query), "p1": float(passages[1] @ query)}, abs=2e-3)


def test_the_trainers_towers_take_the_same_settings(minilm):
    from services.trainer.models import RetrieverModel

    model = RetrieverModel(minilm, None, encoder_overrides={"query_prefix": "query: ", "passage_prefix": "passage: "})
    assert model.query.config == model.docs.config and model.docs.config.passage_prefix == "passage: "
    plain = SentenceEncoder.from_pretrained(minilm)
    np.testing.assert_allclose(model.doc_vectors(["p0"], {"p0": PASSAGES[0]}).numpy(),
                               plain.encode(["passage: " + PASSAGES[0]]), atol=1e-6)  # fmt: skip
    with torch.inference_mode():
        np.testing.assert_allclose(model.query(QUERIES).numpy(), plain.encode(["query: " + q for q in QUERIES]),
                                   atol=1e-5)  # fmt: skip
