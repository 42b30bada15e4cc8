"""A policy adapter's hashed files must be what they claim before the engine sees them."""

from __future__ import annotations

import json

import numpy as np
import pytest
from safetensors.numpy import save_file

from services.common.errors import InvalidRequest
from services.policy.adapters import check_adapter_files


def adapter(folder, weights: bytes | None = None, config: str = '{"r": 8}'):
    folder.mkdir(exist_ok=True)
    if weights is None:
        save_file({"lora_A": np.zeros((2, 2), dtype=np.float32)}, str(folder / "adapter_model.safetensors"))
    else:
        (folder / "adapter_model.safetensors").write_bytes(weights)
    (folder / "adapter_config.json").write_text(config)
    return folder


def test_a_real_adapter_passes(tmp_path):
    check_adapter_files(adapter(tmp_path / "ok"))


@pytest.mark.parametrize(
    ("weights", "config", "reason"),
    [
        (b"PK\x03\x04 a zip of pickles", '{"r": 8}', "not a safetensors file"),
        (None, "{not json", "not JSON"),
        (None, json.dumps([1, 2]), "not a JSON object"),
    ],
)
def test_files_that_are_not_what_they_claim_are_a_400_with_the_reason(tmp_path, weights, config, reason):
    with pytest.raises(InvalidRequest, match=reason) as err:
        check_adapter_files(adapter(tmp_path / "bad", weights, config))
    assert err.value.status_code == 400
