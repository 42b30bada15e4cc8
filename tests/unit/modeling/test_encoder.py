"""The sentence encoder's padding-aware batching, on the real MiniLM."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from services.modeling.encoder import SentenceEncoder, padded_chunks


def test_chunks_end_where_padding_would_cost_more_than_a_forward():
    assert list(padded_chunks([5, 5, 6, 7], batch_size=16, forward_cost=48)) == [[0, 1, 2, 3]]
    assert list(padded_chunks([5, 6, 7, 8, 9], batch_size=2, forward_cost=48)) == [[0, 1], [2, 3], [4]]
    # three rows of 10 tokens would pad by 3 x 90 to take a 100-token query: it gets its own forward
    assert list(padded_chunks([10, 10, 10, 100], batch_size=16, forward_cost=48)) == [[0, 1, 2], [3]]
    assert list(padded_chunks([10, 30], batch_size=16, forward_cost=48)) == [[0, 1]]  # 1 x 20 <= 48
    assert list(padded_chunks([], batch_size=16)) == []


def test_encode_matches_one_padded_forward_in_any_order(models_root):
    encoder = SentenceEncoder.from_pretrained(models_root / "all-MiniLM-L6-v2", dtype="float32")
    texts = ["who wrote hamlet", "a much longer question " * 12 + "about an opera first staged in vienna",
             "capital of france", "what is the boiling point of water at sea level in kelvin", "x"]  # fmt: skip
    with torch.inference_mode():
        reference = encoder.forward(texts).numpy()  # one batch, every row padded to the longest
    encoded = encoder.encode(texts, batch_size=2)
    np.testing.assert_allclose(encoded, reference, atol=1e-5)
    assert encoder.encode(texts[::-1], batch_size=16) == pytest.approx(reference[::-1], abs=1e-5)
    assert encoder.encode([]).shape == (0, encoder.dim)
