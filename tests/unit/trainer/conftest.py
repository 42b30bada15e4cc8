"""Fixtures shared by the trainer's tests."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def tokenizer(policy_models_root):
    """SmolLM2-135M-Instruct's tokenizer (the warm start's trajectories, Q_theta's contexts)."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(policy_models_root / "SmolLM2-135M-Instruct"))
