"""The trainer near its floor (issue 31 section 4): a policy step's tokens/s against the bare forward + backward of
the same model on the same tokens, and against TRL's GRPO loss on the same batch.

All rows run in one process on one loaded LoRA policy (SmolLM2-135M, rank 8, the trainer's own `PolicyModel`)
over the same batch of real multi-turn trajectories (`bench.train_round`'s: demo questions x G, each a SmolLM2
sample after a sampled search; retrieved <information> tokens are context, not completion). Each row does the
work of one round's policy update (policy_steps 1, the default) on every trajectory:

- `floor`: per trajectory, one forward over its tokens (logits for the completion only) and one backward of the
  summed completion log-probs: the least a policy gradient costs, with nothing else;
- `reference`: the KL's reference forward alone (adapter off, no grad): work a step at beta > 0 must do beyond
  the floor, so `ours / (floor + reference)` is what our code adds;
- `ours`: `services/trainer/algo/round.policy_step` as a round calls it (GRPO surrogate, TIS weights, the k3 KL to
  the frozen base at beta 0.01, gradient clipping, the Adam step);
- `ours beta=0`: the same without the KL (no reference forward), to say what the reference costs;
- `trl`: TRL's `GRPOTrainer._compute_loss` on the same trajectories (prompt / completion split at the first
  generated token, retrieved tokens masked by TRL's `tool_mask`), its reference log-probs computed the way TRL
  does (adapter disabled, no grad), backward, the same Adam step; only when `trl` is installed
  (`pip install -e ".[trl-bench]"`), else the row says why it is absent.

tokens/s = tokens forwarded with gradient (every trajectory's whole length) / seconds, the same numerator in
every row. Rows are timed `--steps` times after one warm-up step and interleaved in a rotating order, so a load
spike on a shared machine hits every row alike; a row's time is its median step.

    python -m bench.policy_step [--questions 2 --group 2 --steps 3] [--repeat 3]
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import torch

from bench.repeat import Ratios, add_repeat_arguments, finish, repeat
from bench.script import models_in, prepare_models, script_parser
from bench.train_round import make_batch_file
from services.common.schemas.policy import TrajectoryRecord
from services.trainer.algo.batch import RoundBatch, build_batch
from services.trainer.algo.config import AlgoConfig
from services.trainer.algo.optim import TrainOptimizer
from services.trainer.algo.round import policy_step
from services.trainer.models import PolicyModel

Step = Callable[[], None]
TARGET = 0.8  # ours / floor, issue 31 section 4


def load_batch(policy: PolicyModel, batch_file: Path, beta: float) -> tuple[RoundBatch, AlgoConfig]:
    data = json.loads(batch_file.read_text())
    records = [TrajectoryRecord.model_validate(r) for r in data["records"]]
    group = len({r.group_index for r in records})
    cfg = AlgoConfig(algo="search-r1", group_size=group, beta=beta)
    batch = build_batch(records, cfg, policy.tokenizer, {k: tuple(v) for k, v in data["docs"].items()})
    return batch, cfg


def trained_records(batch: RoundBatch) -> list[TrajectoryRecord]:
    return [r for r in batch.records if any(t.generated_ids for t in r.turns)]


def floor_step(policy: PolicyModel, batch: RoundBatch) -> Step:
    """Forward + backward of the completion log-probs, one trajectory at a time (as `policy_step` goes)."""
    records = trained_records(batch)

    def step() -> None:
        for record in records:
            mask = record.generated_mask
            start = mask.index(1)
            logps = policy.token_logps(record.token_ids, start)
            (-(logps * torch.tensor(mask[start:], dtype=logps.dtype)).sum() / len(records)).backward()
        policy.model.zero_grad(set_to_none=True)

    return step


def reference_step(policy: PolicyModel, batch: RoundBatch) -> Step:
    """The KL's reference forward alone (adapter off, no grad), as `policy_step` runs it at beta > 0."""
    records = trained_records(batch)

    def step() -> None:
        for record in records:
            policy.token_logps(record.token_ids, record.generated_mask.index(1), reference=True)

    return step


def ours_step(policy: PolicyModel, batch: RoundBatch, cfg: AlgoConfig) -> Step:
    optimizer = TrainOptimizer.for_level(policy.parameters(), cfg, cfg.policy_lr, steps_per_round=1, rounds=10_000)

    def step() -> None:
        batch.old_logps = None  # every timed step is a round's first (policy_steps 1): old log-probs are its own
        policy_step(policy, batch, cfg, sequence_weights=None, coupling=None, optimizer=optimizer)

    return step


def trl_inputs(batch: RoundBatch, pad: int) -> dict[str, torch.Tensor]:
    """TRL's GRPO inputs for the same trajectories: the prompt left-padded up to the first generated token, the rest
    right-padded as the completion, retrieved tokens off through `tool_mask` (TRL's multi-turn tool masking)."""
    records = trained_records(batch)
    starts = [r.generated_mask.index(1) for r in records]
    p_width = max(starts)
    c_width = max(len(r.token_ids) - s for r, s in zip(records, starts, strict=True))
    n = len(records)
    prompt_ids, prompt_mask = torch.full((n, p_width), pad), torch.zeros((n, p_width), dtype=torch.long)
    completion_ids, completion_mask = torch.full((n, c_width), pad), torch.zeros((n, c_width), dtype=torch.long)
    tool_mask = torch.zeros((n, c_width), dtype=torch.long)
    for i, (r, s) in enumerate(zip(records, starts, strict=True)):
        prompt_ids[i, p_width - s :], prompt_mask[i, p_width - s :] = torch.tensor(r.token_ids[:s]), 1
        rest = r.token_ids[s:]
        completion_ids[i, : len(rest)], completion_mask[i, : len(rest)] = torch.tensor(rest), 1
        tool_mask[i, : len(rest)] = torch.tensor(r.generated_mask[s:])
    index = {id(r): k for k, r in enumerate(batch.records)}
    advantages = torch.stack([batch.advantages[index[id(r)]] for r in records]).float()
    return {"prompt_ids": prompt_ids, "prompt_mask": prompt_mask, "completion_ids": completion_ids,
            "completion_mask": completion_mask, "tool_mask": tool_mask, "advantages": advantages}  # fmt: skip


def trl_step(policy: PolicyModel, batch: RoundBatch, cfg: AlgoConfig, micro_batch: int, work: Path) -> Step:
    """TRL's GRPO loss through a real `GRPOTrainer` (CPU, fp32, its own accelerator), on our LoRA model."""
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer

    inputs = trl_inputs(batch, policy.tokenizer.pad_token_id or 0)
    n = inputs["advantages"].shape[0]
    args = GRPOConfig(output_dir=str(work / "trl"), use_cpu=True, bf16=False, report_to=[], beta=cfg.beta,
                      epsilon=cfg.eps_low, epsilon_high=cfg.eps_high, loss_type="grpo", num_generations=cfg.group_size,
                      per_device_train_batch_size=micro_batch, generation_batch_size=max(micro_batch, cfg.group_size),
                      logging_steps=10_000, save_strategy="no")  # fmt: skip
    trainer = GRPOTrainer(model=policy.model, reward_funcs=lambda completions, **_: [0.0] * len(completions),
                          args=args, train_dataset=Dataset.from_dict({"prompt": ["x"] * cfg.group_size}),
                          processing_class=policy.tokenizer)  # fmt: skip
    model = trainer.model
    model.eval()  # no dropout, as ours (LoRA dropout is 0 either way)
    optimizer = TrainOptimizer.for_level(policy.parameters(), cfg, cfg.policy_lr, steps_per_round=1, rounds=10_000)
    chunks = [{k: v[i : i + micro_batch] for k, v in inputs.items()} for i in range(0, n, micro_batch)]

    def step() -> None:
        optimizer.zero_grad()
        for chunk in chunks:
            if cfg.beta:  # as TRL's _generate_and_score_completions: the base is the PEFT model, adapter off
                ids = torch.cat([chunk["prompt_ids"], chunk["completion_ids"]], 1)
                mask = torch.cat([chunk["prompt_mask"], chunk["completion_mask"]], 1)
                with torch.no_grad(), model.disable_adapter():
                    chunk["ref_per_token_logps"] = trainer._get_per_token_logps_and_entropies(
                        model, ids, mask, chunk["completion_ids"].size(1))[0]  # fmt: skip
            (trainer._compute_loss(model, chunk) * len(chunk["advantages"]) / n).backward()
        optimizer.step()

    return step


def time_rows(rows: dict[str, Step], steps: int) -> dict[str, float]:
    """Median seconds of each row's step: one warm-up each, then `steps` rounds in a rotating order."""
    for step in rows.values():
        step()
    times: dict[str, list[float]] = {name: [] for name in rows}
    names = list(rows)
    for k in range(steps):
        for name in names[k % len(names) :] + names[: k % len(names)]:
            started = time.perf_counter()
            rows[name]()
            times[name].append(time.perf_counter() - started)
    return {name: statistics.median(t) for name, t in times.items()}


def build_rows(args: argparse.Namespace, batch_file: Path, trl_note: list[str]) -> tuple[dict[str, Step], int, int]:
    """Every row over one loaded policy, built once (not per repetition: a model and a TRL trainer each time only
    add memory) and timed in every repetition. Returns the rows, the trajectories and the tokens."""
    torch.manual_seed(0)
    policy = PolicyModel(models_in(args.work).policy, None, 8, 16)
    batch, cfg = load_batch(policy, batch_file, beta=0.01)
    batch0, cfg0 = load_batch(policy, batch_file, beta=0.0)
    rows: dict[str, Step] = {
        "floor": floor_step(policy, batch),
        "reference": reference_step(policy, batch),
        "ours": ours_step(policy, batch, cfg),
        "ours beta=0": ours_step(policy, batch0, cfg0),
    }
    try:
        rows["trl"] = trl_step(policy, batch, cfg, args.micro_batch, args.work)
    except ImportError as error:
        trl_note[:] = [f"trl row absent: {error} (pip install -e '.[trl-bench]')"]
    records = trained_records(batch)
    return rows, len(records), sum(len(r.token_ids) for r in records)


def measure(rows: dict[str, Step], trajectories: int, tokens: int, steps: int, trl_note: list[str]) -> Ratios:
    seconds = time_rows(rows, steps)
    print(f"\n{trajectories} trajectories, {tokens} tokens; median of {steps} steps")
    print(f"{'row':14} {'seconds':>8} {'tokens/s':>9} {'/ floor':>8}")
    for name, s in seconds.items():
        print(f"{name:14} {s:>8.2f} {tokens / s:>9.0f} {seconds['floor'] / s:>7.2f}x")
    for note in trl_note:
        print(note)
    ratios = {
        "tok_s/ours_over_floor": seconds["floor"] / seconds["ours"],
        "tok_s/ours_over_floor_plus_reference": (seconds["floor"] + seconds["reference"]) / seconds["ours"],
        "tok_s/ours_beta0_over_floor": seconds["floor"] / seconds["ours beta=0"],
    }
    if "trl" in seconds:
        ratios["tok_s/ours_over_trl"] = seconds["trl"] / seconds["ours"]
        ratios["tok_s/trl_over_floor"] = seconds["floor"] / seconds["trl"]
    print(f"ours / floor: {ratios['tok_s/ours_over_floor']:.2f}x (target >= {TARGET}x)")
    return ratios


def main(argv: list[str] | None = None) -> None:
    parser = script_parser(__doc__)
    parser.add_argument("--batch", type=Path, help="Reuse (or create) the batch file here.")
    parser.add_argument("--questions", type=int, default=2, help="Demo questions in the batch.")
    parser.add_argument("--group", type=int, default=2, help="G trajectories per question.")
    parser.add_argument("--steps", type=int, default=3, help="Timed steps per row (after one warm-up).")
    parser.add_argument("--micro-batch", type=int, default=8, help="Trajectories per padded forward in the TRL row.")
    add_repeat_arguments(parser, "policy_step", cost="One repetition is ~4 min on 2 CPU cores.")
    args = parser.parse_args(argv)
    started = time.perf_counter()
    models = prepare_models(args.work)
    batch_file = args.batch or Path(tempfile.mkdtemp()) / "batch.json"
    if not batch_file.exists():
        make_batch_file(models, batch_file, questions=args.questions, group=args.group)
    trl_note: list[str] = []
    rows, trajectories, tokens = build_rows(args, batch_file, trl_note)
    runs = repeat(lambda _: measure(rows, trajectories, tokens, args.steps, trl_note), args.repeat)
    context = {"questions": args.questions, "group": args.group, "steps": args.steps,
               "micro_batch": args.micro_batch, "trl": trl_note[0] if trl_note else "measured"}  # fmt: skip
    finish("policy_step", args, runs, started, context=context, argv=argv)


if __name__ == "__main__":
    main()
