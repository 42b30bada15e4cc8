import json

import pytest

from services.policy.backends.vllm_engine import cpu_kv_cache_bytes, kv_bytes_per_token
from services.policy.settings import PolicySettings

# The attention shape of SmolLM2-135M-Instruct's config.json (30 layers, 3 KV heads of 64).
SMOLLM2 = {"num_hidden_layers": 30, "num_attention_heads": 9, "num_key_value_heads": 3, "head_dim": 64,
           "hidden_size": 576}  # fmt: skip


@pytest.fixture
def model_dir(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(SMOLLM2))
    return tmp_path


def test_kv_bytes_per_token_follow_the_config_and_dtype(model_dir, tmp_path):
    assert kv_bytes_per_token(model_dir, "bfloat16") == 2 * 30 * 3 * 64 * 2 == 23_040
    assert kv_bytes_per_token(model_dir, "float32") == 46_080
    no_head_dim = tmp_path / "mha"
    no_head_dim.mkdir()  # a config without head_dim or num_key_value_heads: plain multi-head attention
    (no_head_dim / "config.json").write_text(json.dumps({"num_hidden_layers": 2, "num_attention_heads": 4,
                                                          "hidden_size": 256}))  # fmt: skip
    assert kv_bytes_per_token(no_head_dim, "bfloat16") == 2 * 2 * 4 * 64 * 2


def test_the_cpu_kv_cache_holds_the_same_tokens_in_fp32_unless_a_size_is_fixed(model_dir):
    settings = PolicySettings(model_dir=str(model_dir))
    bf16, fp32 = cpu_kv_cache_bytes(settings, "bfloat16"), cpu_kv_cache_bytes(settings, "float32")
    assert bf16 == 65_536 * 23_040 and fp32 == 2 * bf16  # 1.4 and 2.8 GiB: room for 32 contexts of 2k tokens
    fixed = PolicySettings(model_dir=str(model_dir), vllm_cpu_kv_cache_gib=1.5)
    assert cpu_kv_cache_bytes(fixed, "bfloat16") == cpu_kv_cache_bytes(fixed, "float32") == int(1.5 * 2**30)
    with pytest.raises(ValueError):
        PolicySettings(vllm_cpu_kv_cache_tokens=10)
