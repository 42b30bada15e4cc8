"""The warm start's artefact: a LoRA adapter as safetensors + manifest.json, written, loaded, and the questions
the shipped ones trained on."""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from services.common.checkpoints import MANIFEST, sha256_file
from services.data.split import trained_ids
from services.modeling.shipped import ADAPTER_FILES, SHIPPED_ADAPTERS, verify_adapter


def shipped_trained_ids(names: Sequence[str]) -> dict[str, set[str]]:
    """Per dataset, the question ids any of the named shipped adapters trained on, in any stage (each manifest
    verified against its files): what a held-out measure, or the demo, must not draw."""
    seen: dict[str, set[str]] = {}
    for name in names:
        for dataset, ids in trained_ids(verify_adapter(SHIPPED_ADAPTERS[name])).items():
            seen.setdefault(dataset, set()).update(ids)
    return seen


def curve_summary(curve: Sequence[dict[str, float]], points: int = 20) -> list[dict[str, float]]:
    """The training loss averaged over `points` equal windows (the manifest keeps this, not every step)."""
    if not curve:
        return []
    size = max(1, math.ceil(len(curve) / points))
    out = []
    for start in range(0, len(curve), size):
        window = curve[start : start + size]
        row = {"step": window[-1]["step"], "examples": window[-1]["examples"]}
        if "tokens" in window[-1]:
            row["tokens"] = window[-1]["tokens"]
        out.append({**row, "loss": sum(w["loss"] for w in window) / len(window)})
    return out


def write_adapter(model: Any, out: Path, manifest: dict[str, Any]) -> dict[str, Any]:
    """Save the LoRA (bf16 safetensors + adapter_config.json) into a temp folder, write the manifest with every
    file's sha256, and rename it into place."""
    import shutil

    import torch

    staging = out.with_name(f".{out.name}.tmp")
    shutil.rmtree(staging, ignore_errors=True)
    for p in model.parameters():
        if p.requires_grad:
            p.data = p.data.to(torch.bfloat16)
    model.save_pretrained(str(staging), safe_serialization=True)
    config_path = staging / "adapter_config.json"
    adapter_config = json.loads(config_path.read_text())
    adapter_config["base_model_name_or_path"] = "SmolLM2-135M-Instruct"  # a name, not this machine's path
    config_path.write_text(json.dumps(adapter_config, indent=2, sort_keys=True) + "\n")
    for extra in staging.iterdir():
        if extra.name not in ADAPTER_FILES:
            extra.unlink() if extra.is_file() else shutil.rmtree(extra)
    manifest = {**manifest, "files": {name: sha256_file(staging / name) for name in ADAPTER_FILES}}
    (staging / MANIFEST).write_text(json.dumps(manifest, indent=1) + "\n")
    if out.exists():
        shutil.rmtree(out)
    staging.replace(out)
    return manifest


def load_adapter_weights(model: Any, folder: Path) -> None:
    """The committed LoRA into a peft model of the same shape (bf16 on disk, the model's dtype in memory)."""
    from peft import set_peft_model_state_dict
    from safetensors.torch import load_file

    result = set_peft_model_state_dict(model, load_file(str(folder / "adapter_model.safetensors")))
    if result.unexpected_keys:
        raise ValueError(f"{folder}: the adapter does not fit this model (e.g. {result.unexpected_keys[0]})")
