"""bench.retriever embeds the corpus with the encoder's passage side (e5's "passage: "), not as queries."""

from __future__ import annotations

import numpy as np

from bench.retriever import DTYPE, embed_corpus
from services.modeling.encoder import SentenceEncoder
from services.retriever.reindex import passage_text
from tests.unit.modeling.test_encoder_settings import bare_copy

DOCS = [{"doc_id": "d1", "title": "Hamlet", "text": "Hamlet is a tragedy written by William Shakespeare."},
        {"doc_id": "d2", "title": "Water", "text": "Water boils at 373.15 K at sea level."}]  # fmt: skip


def test_embed_corpus_uses_the_passage_prefix(models_root, tmp_path):
    e5_named = bare_copy(models_root / "all-MiniLM-L6-v2", tmp_path / "e5-small-copy")  # e5 preset: prefixes
    vectors = embed_corpus(DOCS, e5_named, tmp_path / "cache")
    encoder = SentenceEncoder.from_pretrained(e5_named, dtype=DTYPE)
    texts = [passage_text(d["title"], d["text"]) for d in DOCS]
    np.testing.assert_allclose(vectors, encoder.encode(texts, kind="passage"), atol=2e-2)
    assert not np.allclose(vectors, encoder.encode(texts, kind="query"), atol=2e-2)
