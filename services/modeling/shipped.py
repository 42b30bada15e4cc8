"""The LoRA adapters this repo ships for the policy (in `adapters/` beside this module), by name, for every part that
reads them: `bridge-rl prepare` merges the default one into the default policy, `--adapter NAME` merges another
beside it, and the trainer's warm start continues them and writes adapters of their shape
(services/trainer/warmstart/adapter.py). "reading" reads its evidence (docs/results.md §22i); "protocol" is the
first warm start, which learned the Search-R1 format but not to read (§17)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from services.common.checkpoints import MANIFEST, sha256_file

_ADAPTERS = Path(__file__).resolve().parent / "adapters"
SHIPPED_ADAPTERS = {"reading": _ADAPTERS / "reading", "protocol": _ADAPTERS / "protocol"}
DEFAULT_ADAPTER = "reading"
# The files of a LoRA adapter, as peft writes them and the policy's engines load them; manifest.json lists their sha256.
ADAPTER_FILES = ("adapter_model.safetensors", "adapter_config.json")
DEFAULT_ADAPTER_DIR = SHIPPED_ADAPTERS[DEFAULT_ADAPTER]


def load_shipped_manifest(folder: Path = DEFAULT_ADAPTER_DIR) -> dict[str, Any] | None:
    path = folder / MANIFEST
    return json.loads(path.read_text()) if path.exists() else None


def verify_adapter(folder: Path) -> dict[str, Any]:
    """The manifest, after checking every file it lists against its sha256."""
    manifest = load_shipped_manifest(folder)
    if manifest is None:
        raise FileNotFoundError(f"no {MANIFEST} in {folder}")
    for name, digest in manifest["files"].items():
        if sha256_file(folder / name) != digest:
            raise ValueError(f"{folder / name}: sha256 does not match the manifest")
    return manifest
