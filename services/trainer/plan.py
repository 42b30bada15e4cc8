"""The steps of a round, in the order the Celery tasks chain them.

reweighted (and every algo without a retriever-then-policy order): collect -> train -> publish.
fresh: the same three steps twice, for the retriever and then for the policy, so the policy's rollouts
are collected after the adapted retriever is live:
  collect -> train(retriever) -> publish(retriever) -> collect(fresh) -> train(policy) -> publish(policy).
Each step is keyed by (run_id, round, phase) and returns early when its output exists, so a chain can be
re-entered at its first step after any failure and walks forward to where it stopped.
"""

from __future__ import annotations

from typing import Literal

from services.trainer.algo.config import AlgoConfig

Step = Literal["collect", "train", "publish"]
Phase = Literal["round", "retriever", "policy"]
STEPS: tuple[Step, ...] = ("collect", "train", "publish")


def round_steps(cfg: AlgoConfig) -> list[tuple[Step, Phase]]:
    phases: tuple[Phase, ...] = ("retriever", "policy") if cfg.policy_rollouts == "fresh" else ("round",)
    return [(step, phase) for phase in phases for step in STEPS]


def first_phase(cfg: AlgoConfig) -> Phase:
    return round_steps(cfg)[0][1]


def next_step(cfg: AlgoConfig, round_index: int, step: Step, phase: Phase) -> tuple[int, Step, Phase]:
    """The step after (round_index, step, phase): the next one of the round, or the next round's first."""
    steps = round_steps(cfg)
    position = steps.index((step, phase))  # ValueError: a step this run's plan does not have
    if position + 1 < len(steps):
        return (round_index, *steps[position + 1])
    return (round_index + 1, *steps[0])


def collection(phase: Phase) -> str:
    """Which of the round's rollout collections a phase trains on: "" (the first) or "fresh"."""
    return "fresh" if phase == "policy" else ""
