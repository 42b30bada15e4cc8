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


def test_the_engine_environment_turns_off_the_aot_compile_that_never_loads_unless_the_user_set_it(policy_models_root):
    from services.policy.backends.vllm_engine import VLLMEngine

    engine = VLLMEngine(PolicySettings(model_dir=str(policy_models_root / "SmolLM2-135M-Instruct")))
    env = engine.environment({"PATH": "/bin"})
    assert env["VLLM_USE_AOT_COMPILE"] == "0" and env["PATH"] == "/bin"
    assert env["VLLM_ALLOW_RUNTIME_LORA_UPDATING"] == "True" and env["VLLM_CACHE_ROOT"].endswith("vllm-cache")
    kept = engine.environment({"VLLM_USE_AOT_COMPILE": "1", "VLLM_CACHE_ROOT": "/c", "VLLM_CPU_OMP_THREADS_BIND": "1"})
    names = ("VLLM_USE_AOT_COMPILE", "VLLM_CACHE_ROOT", "VLLM_CPU_OMP_THREADS_BIND")
    assert tuple(kept[n] for n in names) == ("1", "/c", "1")


def test_the_vllm_child_answers_only_a_key_this_service_holds(policy_models_root):
    """Runtime LoRA loading is on: without a key any local process could load an adapter from any path."""
    from services.policy.backends.vllm_engine import VLLMEngine

    settings = PolicySettings(model_dir=str(policy_models_root / "SmolLM2-135M-Instruct"))
    engine, other = VLLMEngine(settings), VLLMEngine(settings)
    assert len(engine.api_key) >= 32 and engine.api_key != other.api_key  # fresh for each start
    assert engine.environment({})["VLLM_API_KEY"] == engine.api_key
    secrets = {"BRIDGE_ADMIN_TOKEN": "admin", "BRIDGE_POLICY_API_KEYS": "k1", "REDIS_URL": "redis://:pw@r:6379/0"}
    assert not set(secrets) & set(engine.environment({**secrets, "PATH": "/bin"}))  # none of BRIDGE's reaches vLLM
    assert engine.api_key not in " ".join(engine.command())  # argv is readable by every local user (ps)
    assert engine._http.headers["authorization"] == f"Bearer {engine.api_key}"
    external = VLLMEngine(settings.model_copy(update={"vllm_url": "http://vllm:8011", "vllm_api_key": "k" * 20}))
    assert external.api_key == "k" * 20 and "VLLM_API_KEY" in external.environment({})
