"""How much learning signal did a run's rewards carry? GRPO learns only from groups whose rewards differ.

Re-scores every logged rollout of a run's rounds under each reward kind (`em`, `f1`, `em-format`; the same
`reward_for` the policy service uses) and counts, per kind, the groups with a non-zero advantage (rewards not all
equal) and the mean reward. Reads only the run folder: no stack, no model beyond the policy's tokenizer.

    python -m experiments.reward_signal --run-dir <data_dir>/runs/<run_id> [--out summary.json]
"""

from __future__ import annotations

import argparse
import json
from collections import defaultdict
from pathlib import Path

KINDS = ("em", "f1", "em-format")


def group_signal(rewards_by_group: dict[str, list[float]]) -> dict[str, float]:
    """Groups whose rewards are not all equal (GRPO's advantage is zero in the others), and the mean reward."""
    groups = list(rewards_by_group.values())
    flat = [r for g in groups for r in g]
    informative = sum(1 for g in groups if len(g) > 1 and max(g) > min(g))
    return {"groups": len(groups), "informative_groups": informative,
            "mean_reward": sum(flat) / max(len(flat), 1)}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--run-dir", type=Path, required=True, help="A run folder (its round-*/rollouts.json).")
    parser.add_argument("--out", type=Path, default=None, help="Write the summary JSON here.")
    args = parser.parse_args()
    from transformers import AutoTokenizer

    from services.common.answers import reward_for, trajectory_text
    from services.trainer.rollout import load_round_rollouts
    from services.trainer.settings import TrainerSettings

    tokenizer = AutoTokenizer.from_pretrained(TrainerSettings().base_policy_dir)
    rounds = []
    for path in sorted(args.run_dir.glob("round-*/rollouts.json")):
        by_kind: dict[str, dict[str, list[float]]] = {k: defaultdict(list) for k in KINDS}
        for record in load_round_rollouts(path)[1]:
            text = trajectory_text(record, tokenizer)
            for kind in KINDS:
                by_kind[kind][record.item_id or ""].append(
                    reward_for(kind, text, record.answer, record.golden_answers or [])
                )
        rounds.append({kind: group_signal(groups) for kind, groups in by_kind.items()})
    summary = {"run": str(args.run_dir), "rounds": rounds,
               "total": {k: {"informative_groups": sum(r[k]["informative_groups"] for r in rounds),
                             "groups": sum(r[k]["groups"] for r in rounds),
                             "mean_reward": sum(r[k]["mean_reward"] for r in rounds) / max(len(rounds), 1)}
                         for k in KINDS}}  # fmt: skip
    print(json.dumps(summary["total"], indent=1))
    if args.out:
        args.out.write_text(json.dumps(summary, indent=2) + "\n")


if __name__ == "__main__":
    main()
