"""What shapes a warm start (recorded in its adapter's manifest), and the check that a resumed run is the run it
resumes."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, Field

from services.common.schemas.retriever import DEFAULT_TOP_K, MAX_AGENT_TOP_K

# Every dataset with a training pool (musique and bamboogle have none: all their questions are the evaluation split).
DEFAULT_DATASETS = (
    "nq",
    "triviaqa",
    "popqa",
    "hotpotqa",
    "2wikimultihopqa",
    "pubmedqa",
    "medqa",
    "medmcqa",
    "bioasq",
)


class ReadingRecipe(BaseModel):
    """How reading examples are drawn (services/trainer/warmstart/reading.py); recorded in the adapter's manifest."""

    passages: int = Field(
        DEFAULT_TOP_K, ge=1, le=MAX_AGENT_TOP_K, description="Passages in an <information> block (serving's top-3)."
    )
    candidates: int = Field(12, ge=1, le=50, description="Retriever depth the hard distractors come from.")
    variants: int = Field(2, ge=1, le=8, description="Variants per question (order, distractors, gold missing).")
    gold_missing: float = Field(0.15, ge=0, le=1, description="Share of variants whose first search misses gold.")
    bridge: float = Field(
        0.0,
        ge=0,
        le=1,
        description="Share of a multi-hop question's other variants whose first search shows only its bridge passage "
        "(no answer, the next title named): the target searches that title, then answers.",
    )


# Which of SmolLM2's linear layers carry the LoRA (`--lora-targets`): every one (what every shipped adapter used),
# attention only, or the MLP only.
LORA_TARGETS: dict[str, tuple[str, ...]] = {
    "all-linear": ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"),
    "attention": ("q_proj", "k_proj", "v_proj", "o_proj"),
    "mlp": ("gate_proj", "up_proj", "down_proj"),
}


class WarmstartConfig(BaseModel):
    """Everything that shapes the warm start; recorded in the adapter's manifest."""

    recipe: Literal["reading", "protocol"] = Field(
        "reading", description="reading: RAFT-style examples that teach reading; protocol: the first warm start's."
    )
    reading: ReadingRecipe = Field(default_factory=ReadingRecipe)
    template_weight: float = Field(
        0.1, ge=0, le=1, description="Loss weight of the agent's non-answer tokens (the answer's are 1)."
    )
    datasets: list[str] = Field(default_factory=lambda: list(DEFAULT_DATASETS))
    per_dataset: int | None = Field(None, ge=1, description="Training-pool questions per dataset (seeded; all).")
    heldout: int = Field(32, ge=0, description="Questions kept out of training for the held-out loss.")
    hold_out: list[str] = Field(
        default_factory=list, description="'dataset:id' questions never trained on (kept for later measures)."
    )
    top_k: int = Field(DEFAULT_TOP_K, ge=1, le=MAX_AGENT_TOP_K, description="Passages per search (serving's default).")
    max_len: int = Field(1536, ge=256, description="Longer trajectories are dropped, never truncated.")
    epochs: float = Field(1.0, gt=0, le=10)
    batch_size: int = Field(4, ge=1, description="Examples per optimizer step (gradient accumulation).")
    lr: float = Field(4e-4, gt=0)
    warmup_steps: int = Field(8, ge=0)
    lora_rank: int = Field(16, ge=1, le=256)
    lora_alpha: int = Field(32, ge=1)
    lora_dropout: float = Field(0.0, ge=0, lt=1)
    target_modules: list[str] = Field(default_factory=lambda: list(LORA_TARGETS["all-linear"]))
    eval_every: int = Field(50, ge=1, description="Optimizer steps between held-out losses.")
    max_minutes: float | None = Field(None, gt=0, description="Stop training after this long (recorded).")
    two_search_repeat: int = Field(
        1, ge=1, le=16, description="Times each two-search trajectory is in the training set (oversampling)."
    )
    seed: int = 0


def comparable(config: dict[str, Any], exclude: set[str]) -> dict[str, Any]:
    """A recorded config as plain JSON with every default filled in: a setting added after it was recorded
    compares equal at its default (which is what the recorded run did)."""
    return json.loads(json.dumps(WarmstartConfig.model_validate(config).model_dump(exclude=exclude)))


def resumable_config(state_dir: Path, config: WarmstartConfig) -> None:
    """A resumed run must be the run it resumes: every setting but the time budget equal."""
    saved = comparable(json.loads((state_dir / "config.json").read_text()), {"max_minutes"})
    now = comparable(config.model_dump(), {"max_minutes"})
    changed = sorted(k for k in saved.keys() | now.keys() if saved.get(k) != now.get(k))
    if changed:
        raise ValueError(f"{state_dir} holds a run with other settings ({', '.join(changed)}): resume it as it was, "
                         "or start a new --state-dir")  # fmt: skip
