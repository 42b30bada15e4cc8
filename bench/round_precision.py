"""A BRIDGE round in bf16 autocast against the same round in float32, on the same batch: what bf16 saves a round
(seconds per trajectory) and what it changes (the policy loss and its gradient).

The batch is bench/train_round.py's (4 demo hotpotqa questions x G 2, real SmolLM2 samples after a sampled
retrieval). Each row runs in a fresh process. First the policy step's loss and its gradient over the LoRA, once in
each precision from the same weights (no optimizer step), compared: the absolute difference of the loss, the cosine and
relative L2 difference of the gradient. Then one whole BRIDGE round in each, timed. bf16 autocast is what the
trainer's `BRIDGE_TRAINER_PRECISION=bfloat16` runs; the target: the gradient's cosine at least 0.99, or bf16 is not
free (the loss is reported as an absolute difference: GRPO's is ~0 at a round's first step).

    python -m bench.round_precision [--repeat 3]

Only where the CPU has native bf16 (AMX or AVX512-BF16): emulated bf16 is ~85x slower (services/common/hardware).
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

import torch

from bench.repeat import Ratios, add_repeat_arguments, finish, repeat
from bench.script import Models, models_in, prepare_models, run_module, script_parser
from bench.train_round import make_batch_file
from services.common.hardware import native_bf16
from services.common.schemas.policy import TrajectoryRecord
from services.trainer.algo.batch import build_batch
from services.trainer.algo.config import AlgoConfig
from services.trainer.algo.round import policy_step, train_round
from services.trainer.device import Placement
from services.trainer.models import PolicyModel, RetrieverModel

PRECISIONS = ("float32", "bfloat16")


class NoStep:
    """An optimizer that keeps the gradient and takes no step: the loss and gradient at the same weights."""

    def __init__(self, params: list[torch.nn.Parameter]) -> None:
        self.params = params
        self.adam = SimpleNamespace(param_groups=[{"lr": 0.0}])  # what policy_step reports as the step size

    def zero_grad(self) -> None:
        for p in self.params:
            p.grad = None

    def step(self) -> float:
        return 0.0


def load(models: Models, batch_file: Path, precision: str):
    placement = Placement.resolve("cpu", precision)  # type: ignore[arg-type]
    torch.manual_seed(0)
    data = json.loads(batch_file.read_text())
    policy = PolicyModel(models.policy, None, 8, 16, placement=placement)
    retriever = RetrieverModel(models.retriever, None, placement=placement)
    records = [TrajectoryRecord.model_validate(r) for r in data["records"]]
    cfg = AlgoConfig(algo="bridge", group_size=len({r.group_index for r in records}))
    batch = build_batch(records, cfg, policy.tokenizer, {k: tuple(v) for k, v in data["docs"].items()})
    return placement, policy, retriever, batch, cfg


def gradient_row(models: Models, batch_file: Path, precision: str, out: Path) -> dict:
    placement, policy, _, batch, cfg = load(models, batch_file, precision)
    params = [p for p in policy.parameters() if p.requires_grad]
    with placement.scope():
        stats = policy_step(policy, batch, cfg, sequence_weights=None, coupling=None, optimizer=NoStep(params))
    torch.save(torch.cat([p.grad.flatten().float() for p in params if p.grad is not None]), out)
    return {"precision": precision, "loss": stats["loss/policy"]}


def round_row(models: Models, batch_file: Path, precision: str) -> dict:
    placement, policy, retriever, batch, cfg = load(models, batch_file, precision)
    retriever.doc_vectors(sorted(batch.doc_texts), batch.doc_texts)
    started = time.perf_counter()
    with placement.scope():
        train_round(policy, retriever, batch, cfg, 1.0)
    seconds = time.perf_counter() - started
    return {"precision": precision, "seconds": seconds, "trajectories": len(batch.records)}


def measure(args: argparse.Namespace, batch_file: Path) -> Ratios:
    folder = Path(tempfile.mkdtemp())
    grads, rounds = {}, {}
    for precision in PRECISIONS:
        out = run_module("bench.round_precision", "--one", f"gradient:{precision}", "--batch", str(batch_file),
                         "--grad-out", str(folder / f"{precision}.pt"), "--work", str(args.work))  # fmt: skip
        grads[precision] = json.loads(out.strip().splitlines()[-1])
    for precision in PRECISIONS:
        out = run_module("bench.round_precision", "--one", f"round:{precision}", "--batch", str(batch_file),
                         "--work", str(args.work))  # fmt: skip
        rounds[precision] = json.loads(out.strip().splitlines()[-1])
    g32, g16 = (torch.load(folder / f"{p}.pt") for p in PRECISIONS)
    cosine = float(torch.nn.functional.cosine_similarity(g32, g16, dim=0))
    l2 = float((g16 - g32).norm() / g32.norm())
    loss32, loss16 = grads["float32"]["loss"], grads["bfloat16"]["loss"]
    per32 = rounds["float32"]["seconds"] / rounds["float32"]["trajectories"]
    per16 = rounds["bfloat16"]["seconds"] / rounds["bfloat16"]["trajectories"]
    # GRPO's loss at the first step of a round is ~0 by construction (the ratio is 1, the advantages sum to 0 in a
    # group): the absolute difference says what bf16 changes, a relative one would divide by ~0.
    print(f"policy loss: float32 {loss32:.6f}, bf16 {loss16:.6f} ({abs(loss16 - loss32):.6f} apart)")
    print(f"gradient over the LoRA: cosine {cosine:.4f}, relative L2 difference {l2:.3f}")
    print(f"one BRIDGE round: float32 {per32:.1f} s a trajectory, bf16 {per16:.1f} s ({per16 / per32:.2f}x)")
    return {
        "seconds_per_trajectory/bf16_over_float32": per16 / per32,
        "policy_loss/bf16_abs_difference": abs(loss16 - loss32),
        "policy_gradient/bf16_cosine": cosine,
    }


def main(argv: list[str] | None = None) -> None:
    parser = script_parser(__doc__)
    parser.add_argument("--one", help=argparse.SUPPRESS)
    parser.add_argument("--grad-out", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--batch", type=Path, help="Reuse (or create) the batch file here.")
    add_repeat_arguments(parser, "round_precision", cost="One repetition is four fresh processes (~5 min on 2 cores).")
    args = parser.parse_args(argv)
    if args.one:
        kind, precision = args.one.split(":")
        models = models_in(args.work)
        row = (gradient_row(models, args.batch, precision, args.grad_out) if kind == "gradient"
               else round_row(models, args.batch, precision))  # fmt: skip
        print(json.dumps(row))
        return
    if not native_bf16():
        raise SystemExit("this CPU has no native bf16 (AMX or AVX512-BF16): bf16 would be emulated, ~85x slower")
    started = time.perf_counter()
    models = prepare_models(args.work)
    batch_file = args.batch or Path(tempfile.mkdtemp()) / "batch.json"
    if not batch_file.exists():
        make_batch_file(models, batch_file)
    runs = repeat(lambda _: measure(args, batch_file), args.repeat)
    finish("round_precision", args, runs, started, argv=argv)


if __name__ == "__main__":
    main()
