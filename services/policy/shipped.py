"""The adapters this repo ships beside the policy (their folders are in this package), by name: `bridge-rl prepare`
merges the default one into the default policy, and `--adapter NAME` merges another beside it. "reading" reads its
evidence (docs/results.md §22i); "protocol" is the first warm start, which learned the Search-R1 format but not to
read (§17). The trainer's warm start writes adapters of this shape (services/trainer/warmstart/adapter.py)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from services.common.checkpoints import MANIFEST, sha256_file

_HERE = Path(__file__).resolve().parent
SHIPPED_ADAPTERS = {"reading": _HERE / "reading_adapter", "protocol": _HERE / "warmstart_adapter"}
DEFAULT_ADAPTER = "reading"
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
