"""Going on from a committed adapter: a later session of the same run (`continuation`), or a new stage that starts
from its weights (`next_stage`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field

from services.modeling.shipped import verify_adapter
from services.trainer.warmstart.config import WarmstartConfig, comparable
from services.trainer.warmstart.data import heldout_draw
from services.trainer.warmstart.examples import SFTExample
from services.trainer.warmstart.sft import training_order

CONTINUATION_FILE = "continued.json"
CONTINUABLE = {"epochs", "max_minutes"}  # what a continuation from an adapter may change: its order is a prefix


class Continuation(BaseModel):
    """A run going on from a committed adapter of itself (a new machine: only git survived), kept in the state dir
    so that `--resume` goes on with the same split and order."""

    adapter: str
    version: str
    files: dict[str, str]
    heldout: list[str] = Field(description="'dataset:id' held out by the adapter's run: held out again")
    first: list[str] = Field(description="'dataset:id' the adapter trained on, in its order: they open this order")
    state: dict[str, Any] = Field(description="The SFTState the adapter stopped at; empty for a new stage")
    stage: int = Field(1, ge=1, description="1, or the stage this run is when it started from an earlier one's adapter")
    earlier_trained: dict[str, list[str]] = Field(
        default_factory=dict, description="dataset -> ids trained on by the earlier stages the weights come from"
    )
    initialised_from: dict[str, Any] | None = Field(None, description="The adapter the first stage-N session loaded")


def adapter_seen(manifest: dict[str, Any], config: WarmstartConfig) -> list[str]:
    """The questions an adapter trained on, in order: its manifest's `seen`, or, for an adapter written before the
    manifest kept it, its run's seeded order recomputed from the manifest's question ids (checked: the same draw
    must give the held-out ids the manifest lists)."""
    seen = manifest["data"].get("seen")
    if seen is None:
        keys = [f"{d}:{i}" for d, ids in manifest["data"]["trained_ids"].items() for i in ids]
        held, trained = heldout_draw(keys + manifest["data"]["heldout_ids"], config)
        if sorted(held) != sorted(manifest["data"]["heldout_ids"]):
            raise ValueError("the adapter's order cannot be recomputed from its manifest: another draw")
        stand_ins = [[SFTExample(id=k.split(":", 1)[1], dataset=k.split(":", 1)[0], input_ids=[0], loss_mask=[0],
                                 kind=config.recipe, variant=0, searches=[], answer="", answer_shown=False)]
                     for k in trained]  # fmt: skip
        order = training_order(stand_ins, manifest["config"]["epochs"], config.seed)
        seen = [f"{e.dataset}:{e.id}" for e in order[: manifest["training"]["examples_seen"]]]
    # a run that repeats its two-search variants visits such a question more than once an epoch (training_order
    # checks those counts against the rebuilt examples); any other repeat is a second epoch
    if len(set(seen)) != len(seen) and manifest["config"].get("two_search_repeat", 1) <= 1:
        raise ValueError("the adapter trained past its first epoch: continue it on the machine that holds its state")
    return seen


def continuation(folder: Path, config: WarmstartConfig) -> Continuation:
    """Where the committed adapter at `folder` stopped, when it is an earlier session of this very run: the same
    settings but the length and the time budget (its files checked against their sha256). Its examples may be
    rebuilt here with other distractors (another machine's index), so its held-out questions and the order of what
    it trained on are carried over, not recomputed: the examples after its step are ones it never saw."""
    manifest = verify_adapter(folder)
    saved = comparable(manifest["config"], CONTINUABLE)
    now = comparable(config.model_dump(), CONTINUABLE)
    changed = sorted(k for k in saved.keys() | now.keys() if saved.get(k) != now.get(k))
    if changed:
        raise ValueError(f"{folder} was trained with other settings ({', '.join(changed)}): only "
                         f"{' and '.join(sorted(CONTINUABLE))} may change to continue it")  # fmt: skip
    training = manifest["training"]
    state = {
        "step": training["steps"], "total_steps": training["total_steps"], "examples_seen": training["examples_seen"],
        "tokens_seen": training["tokens_seen"], "wall_s": training["wall_s"], "heldout": training["heldout_loss"],
        "sessions": training["sessions"], "prior_curve": training.get("prior_loss_curve", []) + training["loss_curve"],
    }  # fmt: skip
    return Continuation(adapter=str(folder), version=manifest["version"], files=manifest["files"],
                        heldout=manifest["data"]["heldout_ids"], first=adapter_seen(manifest, config),
                        state=state, stage=manifest.get("stage", 1),
                        earlier_trained=manifest["data"].get("earlier_trained_ids", {}),
                        initialised_from=manifest.get("initialised_from"))  # fmt: skip


def next_stage(folder: Path) -> Continuation:
    """A new stage from a committed adapter: its LoRA, then this run's own settings (a recipe may change), its own
    order over the questions and its own schedule from step 0. The adapter's held-out questions stay held out, and
    what every earlier stage trained on stays listed in the new manifest (the weights have seen it)."""
    manifest = verify_adapter(folder)
    earlier = {d: set(ids) for d, ids in manifest["data"].get("earlier_trained_ids", {}).items()}
    for dataset, ids in manifest["data"]["trained_ids"].items():
        earlier.setdefault(dataset, set()).update(ids)
    stage = manifest.get("stage", 1) + 1
    return Continuation(adapter=str(folder), version=manifest["version"], files=manifest["files"],
                        heldout=manifest["data"]["heldout_ids"], first=[], state={}, stage=stage,
                        earlier_trained={d: sorted(ids) for d, ids in sorted(earlier.items())},
                        initialised_from={"adapter": str(folder), "version": manifest["version"],
                                          "files": manifest["files"], "stage": stage - 1})  # fmt: skip
