"""The shipped warm-start adapters: each manifest matches its files, `prepare` merges the default one (reading)
once, and again only when the adapter changes (a data dir prepared with the protocol adapter gets the reading one),
a tampered file is refused, and the merged folder becomes the default policy."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from services.cli.prepare import prepare_warmstart_model
from services.common.settings import CommonSettings
from services.data.split import EVAL_SPLIT, trained_ids
from services.modeling.shipped import DEFAULT_ADAPTER, DEFAULT_ADAPTER_DIR, SHIPPED_ADAPTERS, verify_adapter

REPO = Path(__file__).resolve().parents[3]


@pytest.mark.parametrize("name", sorted(SHIPPED_ADAPTERS))
def test_every_shipped_manifest_matches_its_files_and_the_split(name):
    folder = SHIPPED_ADAPTERS[name]
    if name != DEFAULT_ADAPTER and not folder.exists():
        pytest.skip(f"{folder} is not committed")
    manifest = verify_adapter(folder)
    assert set(manifest["files"]) == {"adapter_model.safetensors", "adapter_config.json"}
    assert manifest["command"].startswith("bridge-rl warmstart") and manifest["data"]["eval_split"] == EVAL_SPLIT
    assert manifest["training"]["heldout_loss"][-1]["loss"] < manifest["training"]["heldout_loss"][0]["loss"]
    held = set(manifest["data"]["heldout_ids"]) | set(manifest["data"].get("hold_out_ids", []))
    # no trained id is among the first EVAL_SPLIT questions of its file (checked against the shared data if present),
    # nor among the questions it holds out
    qa_dir = REPO.parent / "shared" / "data" / "qa"
    for dataset, ids in manifest["data"]["trained_ids"].items():
        assert not {f"{dataset}:{i}" for i in ids} & held
        path = qa_dir / f"{dataset}.jsonl"
        if path.exists():
            evaluation = {json.loads(line)["id"] for line in path.open().readlines()[:EVAL_SPLIT]}
            assert not evaluation & set(ids)


def test_prepare_merges_once_and_refuses_a_tampered_adapter(tmp_path, policy_models_root):
    base = policy_models_root / "SmolLM2-135M-Instruct"
    final = tmp_path / "models" / "SmolLM2-135M-Instruct-warmstart"
    settings = CommonSettings(data_dir=tmp_path)
    assert settings.policy_model_dir == settings.base_policy_model_dir  # nothing merged yet: the raw base
    assert prepare_warmstart_model(final, base) is True
    assert (final / "config.json").exists() and (final / "warmstart_manifest.json").exists()
    assert settings.policy_model_dir == final  # the merged warm start is now the default policy
    merged = json.loads((final / "warmstart_manifest.json").read_text())
    assert DEFAULT_ADAPTER == "reading" and merged["files"] == verify_adapter(DEFAULT_ADAPTER_DIR)["files"]
    assert prepare_warmstart_model(final, base) is False  # idempotent
    # a data dir merged from another adapter (an earlier default) is re-merged with the default one
    assert prepare_warmstart_model(final, base, SHIPPED_ADAPTERS["protocol"]) is True
    assert json.loads((final / "warmstart_manifest.json").read_text())["files"] != merged["files"]
    assert prepare_warmstart_model(final, base) is True
    assert json.loads((final / "warmstart_manifest.json").read_text())["files"] == merged["files"]
    tampered = tmp_path / "adapter"
    shutil.copytree(DEFAULT_ADAPTER_DIR, tampered)
    config = json.loads((tampered / "adapter_config.json").read_text())
    config["r"] = 4
    (tampered / "adapter_config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match="sha256"):
        prepare_warmstart_model(final, base, tampered)


@pytest.mark.parametrize("name", sorted(SHIPPED_ADAPTERS))
def test_the_demo_trains_on_questions_neither_evaluated_nor_warm_started(name):
    demo = [json.loads(line)["id"] for line in (REPO / "services/demo_data/hotpotqa_train.jsonl").open()]
    assert len(demo) == len(set(demo)) >= 8  # the demo asks 3 and trains 2 rounds of 4
    data = verify_adapter(SHIPPED_ADAPTERS[name])["data"]
    for trained in (data["trained_ids"], data.get("earlier_trained_ids", {})):  # every stage of the adapter
        assert not set(demo) & set(trained.get("hotpotqa", []))
    assert not set(demo) & trained_ids(verify_adapter(SHIPPED_ADAPTERS[name]))["hotpotqa"]
    path = REPO.parent / "shared" / "data" / "qa" / "hotpotqa.jsonl"
    if path.exists():
        evaluation = {json.loads(line)["id"] for line in path.open().readlines()[:EVAL_SPLIT]}
        assert not evaluation & set(demo)


def test_the_reading_adapter_continues_only_as_the_run_it_came_from():
    from services.trainer.warmstart.config import WarmstartConfig
    from services.trainer.warmstart.stages import continuation

    folder = SHIPPED_ADAPTERS["reading"]
    if not folder.exists():
        pytest.skip(f"{folder} is not committed")
    manifest = verify_adapter(folder)
    config = WarmstartConfig.model_validate({**manifest["config"], "epochs": 0.9, "max_minutes": 10})
    plan = continuation(folder, config)
    training = manifest["training"]
    assert plan.state["step"] == training["steps"] > 0 and plan.version == manifest["version"]
    assert plan.heldout == manifest["data"]["heldout_ids"] and plan.state["heldout"] == training["heldout_loss"]
    # what it trained on, in order: training questions of this stage, none held out, as many as it saw; each once,
    # unless the run repeats its two-search variants (then a question may be visited that many times more)
    assert len(plan.first) == training["examples_seen"]
    repeats = manifest["config"].get("two_search_repeat", 1)
    assert len(set(plan.first)) == len(plan.first) if repeats == 1 else len(set(plan.first)) < len(plan.first)
    trained = {f"{d}:{i}" for d, ids in manifest["data"]["trained_ids"].items() for i in ids}
    assert set(plan.first) <= trained and not set(plan.first) & set(plan.heldout)
    with pytest.raises(ValueError, match="template_weight"):
        continuation(folder, config.model_copy(update={"template_weight": 0.5}))
    # another bridge share is another recipe: a new stage, not a continuation
    bridge = manifest["config"]["reading"].get("bridge", 0)
    bridged = config.model_copy(update={"reading": config.reading.model_copy(update={"bridge": bridge + 0.1})})
    with pytest.raises(ValueError, match="reading"):
        continuation(folder, bridged)


def test_a_new_stage_starts_from_the_adapter_and_keeps_its_held_out_and_its_training_ids():
    from services.trainer.warmstart.stages import next_stage

    folder = SHIPPED_ADAPTERS["reading"]
    if not folder.exists():
        pytest.skip(f"{folder} is not committed")
    manifest = verify_adapter(folder)
    plan = next_stage(folder)
    assert plan.stage == manifest.get("stage", 1) + 1 and plan.state == {} and plan.first == []
    assert plan.heldout == manifest["data"]["heldout_ids"]
    for dataset, ids in manifest["data"]["trained_ids"].items():
        assert set(ids) <= set(plan.earlier_trained[dataset])
    assert plan.initialised_from == {"adapter": str(folder), "version": manifest["version"],
                                     "files": manifest["files"], "stage": plan.stage - 1}  # fmt: skip


@pytest.mark.parametrize("name", sorted(SHIPPED_ADAPTERS))
def test_the_committed_lora_loads_into_the_base_as_it_was_saved(policy_models_root, name):
    import torch
    from peft import LoraConfig, get_peft_model
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    from services.trainer.warmstart.adapter import load_adapter_weights

    folder = SHIPPED_ADAPTERS[name]
    config = json.loads((folder / "adapter_config.json").read_text())
    base = AutoModelForCausalLM.from_pretrained(str(policy_models_root / "SmolLM2-135M-Instruct"), dtype=torch.float32)
    lora = LoraConfig(r=config["r"], lora_alpha=config["lora_alpha"], target_modules=config["target_modules"],
                      task_type="CAUSAL_LM")  # fmt: skip
    model = get_peft_model(base, lora)
    load_adapter_weights(model, folder)
    saved = load_file(str(folder / "adapter_model.safetensors"))
    params = {n.replace(".default", ""): p for n, p in model.named_parameters() if p.requires_grad}
    assert set(saved) == set(params)
    for name, value in saved.items():
        assert torch.equal(params[name].detach().to(value.dtype), value), name
