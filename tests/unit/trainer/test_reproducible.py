"""A round is reproducible: new adapters start from their seed, and a retried round rewrites its checkpoint."""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import load_file

from services.common.checkpoints import load_manifest
from services.trainer.checkpoint import write_policy, write_retriever
from services.trainer.models import PolicyModel, RetrieverModel

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def base_dirs(policy_models_root):
    return policy_models_root / "SmolLM2-135M-Instruct", policy_models_root / "all-MiniLM-L6-v2"


def lora_a(params) -> list[torch.Tensor]:
    return [p.detach().clone() for n, p in params if "lora_A" in n]


def test_new_adapters_start_from_their_seed_whatever_the_global_rng_did(base_dirs):
    policy_dir, retriever_dir = base_dirs
    torch.manual_seed(1)
    first = lora_a(PolicyModel(policy_dir, None, 4, 8, seed=5).model.named_parameters())
    torch.manual_seed(2)  # a different global state, as a worker that ran other work first has
    torch.rand(1000)
    second = lora_a(PolicyModel(policy_dir, None, 4, 8, seed=5).model.named_parameters())
    assert first and all(torch.equal(a, b) for a, b in zip(first, second, strict=True))
    other = lora_a(PolicyModel(policy_dir, None, 4, 8, seed=6).model.named_parameters())
    assert not torch.equal(first[0], other[0])
    retrievers = [RetrieverModel(retriever_dir, None, params="lora", lora_rank=4, seed=5) for _ in range(2)]
    torch.rand(10)
    a, b = (lora_a(r.query.model.named_parameters()) for r in retrievers)
    assert a and all(torch.equal(x, y) for x, y in zip(a, b, strict=True))


def test_a_retried_round_rewrites_its_own_checkpoint(base_dirs, tmp_path):
    """The second attempt's weights are what its version holds, not the first attempt's (which would pair the
    first attempt's checkpoint with the second attempt's optimizer state)."""
    policy_dir, retriever_dir = base_dirs
    retriever = RetrieverModel(retriever_dir, None)
    write_retriever(tmp_path, retriever, "run-r0-retriever", None, algorithm="bridge", round=0)
    with torch.no_grad():
        next(p for p in retriever.query.parameters()).add_(1.0)
    path = write_retriever(tmp_path, retriever, "run-r0-retriever", None, algorithm="bridge", round=0)
    saved = load_file(str(path / "query_encoder.safetensors"))
    name, param = next(iter(retriever.query.model.state_dict().items()))
    assert torch.equal(saved[name], param)
    load_manifest(tmp_path, "run-r0-retriever")  # sha256 of every file matches the rewritten ones
    policy = PolicyModel(policy_dir, None, 4, 8)
    write_policy(tmp_path, policy, "run-r0-policy", None, algorithm="bridge", round=0)
    with torch.no_grad():
        for n, p in policy.model.named_parameters():
            if "lora_B" in n:
                p.add_(0.5)
    path = write_policy(tmp_path, policy, "run-r0-policy", None, algorithm="bridge", round=0)
    saved = load_file(str(path / "adapter_model.safetensors"))
    assert any(float(v.abs().sum()) > 0 for k, v in saved.items() if "lora_B" in k)
    assert not list(tmp_path.glob(".*replaced*"))
