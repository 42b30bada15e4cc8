"""Seconds and peak memory of one training round: search-r1, bridge (the paper's estimator), bridge's
two-state estimator, and a second-order baseline; then the retriever update alone, bridge vs two-state.

All run on the same batch (built once and saved): 4 demo hotpotqa questions x group 2, each trajectory a
real SmolLM2 sample after a sampled retrieval over 20 candidates, every second one answering with the gold
answer (so rewards differ within a group; `services/trainer/synthetic.py`). Each row runs in a fresh process so its
peak RSS is its own: the high-water mark is reset after loading (Linux clear_refs), so "peak" is the round's
and "over load" subtracts the RSS the loaded models and batch hold.

The second-order baseline is the implicit-function hypergradient:
  d f / d theta = grad_theta f - grad^2_{theta phi} g . [grad^2_{phi phi} g]^-1 grad_phi f,
with the inverse-Hessian-vector product by a 3-term Neumann series of Hessian-vector products (double
backward through the retriever) and the mixed term by a further backward through Q_theta's policy graph.

Targets: bridge at most 1.10x search-r1's peak memory, and below the second-order baseline's; the paper
reports the two-state estimator's retriever update at 2x bridge's memory and 2.3x its time.

    python -m bench.train_round [--retriever-params lora] [--repeat 3]

The six rows run `--repeat` times (default 3, ~15 min each on 2 cores); every ratio is printed per repeat, then as
its median and spread with the CPU, and written to `--json` (docs/results/bench/train_round.json, which
`python -m tools.perf_table --write` puts in docs/performance.md).
"""

from __future__ import annotations

import argparse
import json
import resource
import tempfile
import time
from pathlib import Path

import torch

from bench.repeat import Ratios, add_repeat_arguments, finish, repeat
from bench.script import Models, models_in, prepare_models, run_module, script_parser
from services.common.schemas.policy import TrajectoryRecord
from services.trainer.algo.batch import build_batch
from services.trainer.algo.config import AlgoConfig
from services.trainer.algo.losses import retriever_lower_loss
from services.trainer.algo.optim import RoundOptimizers
from services.trainer.algo.round import (
    answer_logprobs,
    candidate_logps,
    descend,
    lower_loss,
    policy_step,
    retrieval_credit,
    retriever_phase,
    score_old_retrieval,
    subset_logps,
    train_round,
)
from services.trainer.device import Placement
from services.trainer.models import PolicyModel, RetrieverModel
from services.trainer.synthetic import build_rollouts, demo_data


def rss_mb() -> float:
    """Peak resident memory since the last `reset_peak` (Linux VmHWM), else since the process started."""
    status = Path("/proc/self/status")
    if status.exists():
        for line in status.read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def current_mb() -> float:
    status = Path("/proc/self/status")
    if status.exists():
        for line in status.read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return rss_mb()


def reset_peak() -> None:
    """Linux: writing 5 to clear_refs resets the peak RSS, so loading's transient peak does not hide a round's."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
    except OSError:
        pass


def make_batch_file(models: Models, out: Path, questions: int = 4, group: int = 2) -> None:
    items, corpus = demo_data()
    policy = PolicyModel(models.policy, None, 8, 16)
    retriever = RetrieverModel(models.retriever, None)
    records, docs = build_rollouts(policy, retriever, items[:questions], corpus, group=group, gold_every=2)
    out.write_text(json.dumps({"records": [r.model_dump(mode="json") for r in records], "docs": docs}))


def second_order_round(policy, retriever, batch, cfg, lam: float) -> None:
    """Implicit-function hypergradient for theta (Neumann inverse-HVP), then the usual phi steps."""
    score_old_retrieval(retriever, batch, cfg.tis_cap)  # P_phi_old, the credit's ratio denominator
    # The pooler is not used by mean pooling: keep the parameters that carry gradient.
    phi = [p for n, p in retriever.query.named_parameters() if "pooler" not in n]
    all_phi = list(retriever.query.parameters())
    theta = policy.parameters()
    grad_f_phi = torch.autograd.grad(
        retrieval_credit(retriever.query, retriever, batch, cfg) / lam, phi, allow_unused=True
    )
    grad_f_phi = [torch.zeros_like(p) if g is None else g for g, p in zip(grad_f_phi, phi, strict=True)]
    log_p = subset_logps(candidate_logps(retriever.query, retriever, batch), batch)
    deployed = log_p.detach()
    q_theta = torch.stack([torch.softmax(answer_logprobs(policy, batch.q_samples[i]) / cfg.beta_q, -1)
                           for i in range(len(batch.q_samples))])  # graph through theta  # fmt: skip
    g = retriever_lower_loss(q_theta, log_p, deployed, cfg.mu)
    grad_g_phi = torch.autograd.grad(g, phi, create_graph=True)
    v, term, eta = [t.clone() for t in grad_f_phi], [t.clone() for t in grad_f_phi], 0.1
    for _ in range(3):  # v ≈ H^-1 grad_phi f by (I - eta H)^i terms
        hvp = torch.autograd.grad(grad_g_phi, phi, grad_outputs=term, retain_graph=True)
        term = [t - eta * h for t, h in zip(term, hvp, strict=True)]
        v = [a + b for a, b in zip(v, term, strict=True)]
    dot = sum((gg * vv.detach()).sum() for gg, vv in zip(grad_g_phi, v, strict=True))
    mixed = torch.autograd.grad(dot, theta, allow_unused=True)
    optim = RoundOptimizers(cfg)
    policy_step(policy, batch, cfg, sequence_weights=None, coupling=None, optimizer=optim.get("policy", theta))
    with torch.no_grad():  # the hypergradient's correction, applied as one more step on theta
        for p, m in zip(theta, mixed, strict=True):
            if m is not None:
                p -= cfg.policy_lr * eta * m
    q_fixed = q_theta.detach()
    descend(
        optim.get("phi", all_phi),
        lambda: (
            retrieval_credit(retriever.query, retriever, batch, cfg) / lam
            + lower_loss(retriever.query, retriever, batch, q_fixed, cfg)
        ),
        cfg.retriever_steps,
    )


ROWS = {  # row -> (algo, estimator, retriever update only)
    "search-r1": ("search-r1", "bridge", False),
    "bridge": ("bridge", "bridge", False),
    "two-state": ("bridge", "two-state", False),
    "second-order": ("second-order", "two-state", False),
    "bridge/retriever": ("bridge", "bridge", True),
    "two-state/retriever": ("bridge", "two-state", True),
}


def run_one(row: str, models: Models, batch_file: Path, retriever_params: str, q_steps: int | None = None,
            device: str = "auto") -> dict:  # fmt: skip
    placement = Placement.resolve(device)
    with placement.scope():
        result = _run_one(row, models, batch_file, retriever_params, q_steps, placement)
    if placement.device.type == "cuda":
        result["gpu_peak_mb"] = torch.cuda.max_memory_allocated(placement.device) / 2**20
    return {**result, "device": placement.describe()}


def _run_one(row: str, models: Models, batch_file: Path, retriever_params: str, q_steps: int | None,
             placement: Placement) -> dict:  # fmt: skip
    algo, estimator, retriever_only = ROWS[row]
    torch.manual_seed(0)
    data = json.loads(batch_file.read_text())
    policy = PolicyModel(models.policy, None, 8, 16, placement=placement)
    retriever = RetrieverModel(models.retriever, None, params=retriever_params, placement=placement)
    records = [TrajectoryRecord.model_validate(r) for r in data["records"]]
    group = len({r.group_index for r in records})  # the batch file says how many rollouts a question has
    cfg = AlgoConfig(algo="bridge" if algo == "second-order" else algo, estimator=estimator, group_size=group,
                     retriever_params=retriever_params, **({"q_steps": q_steps} if q_steps else {}))  # fmt: skip
    batch = build_batch(records, cfg, policy.tokenizer, {k: tuple(v) for k, v in data["docs"].items()})
    retriever.doc_vectors(sorted(batch.doc_texts), batch.doc_texts)  # warm the frozen e_d cache
    loaded = current_mb()
    reset_peak()
    if placement.device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(placement.device)
    started = time.perf_counter()
    if algo == "second-order":
        from torch.nn.attention import SDPBackend, sdpa_kernel

        # Hessian-vector products need a double backward, which the CPU flash-attention kernel lacks.
        with sdpa_kernel(SDPBackend.MATH):
            second_order_round(policy, retriever, batch, cfg, 1.0)
    elif retriever_only:  # the lower level alone: Q_theta, z (two-state), phi
        score_old_retrieval(retriever, batch, cfg.tis_cap)
        retriever_phase(policy, retriever, batch, cfg, 1.0, RoundOptimizers(cfg))
    else:
        train_round(policy, retriever, batch, cfg, 1.0)
    seconds = time.perf_counter() - started
    return {"row": row, "seconds": seconds, "peak_mb": rss_mb(), "loaded_mb": loaded, "q_samples": len(batch.q_samples)}


def measure_rows(args: argparse.Namespace, batch_file: Path, results_by_repeat: list[dict]) -> Ratios:
    """One repetition: every row in its own process, printed as a table, and the ratios between them."""
    results = {}
    for row in ROWS:
        out = run_module("bench.train_round", "--one", row, "--batch", str(batch_file),
                         "--retriever-params", args.retriever_params, "--work", str(args.work),
                         "--device", args.device)  # fmt: skip
        results[row] = json.loads(out.strip().splitlines()[-1])
    results_by_repeat.append(results)
    print(f"\nretriever params: {args.retriever_params}; device: {results['bridge']['device']}")
    gpu = "gpu_peak_mb" in results["bridge"]
    print(f"{'row':20} {'seconds':>8} {'peak MB':>9} {'over load MB':>13}" + (f" {'GPU peak MB':>12}" if gpu else ""))
    for row, r in results.items():
        print(f"{row:20} {r['seconds']:>8.1f} {r['peak_mb']:>9.0f} {r['peak_mb'] - r['loaded_mb']:>13.0f}"
              + (f" {r['gpu_peak_mb']:>12.0f}" if gpu else ""))  # fmt: skip
    b, s, so, two = results["bridge"], results["search-r1"], results["second-order"], results["two-state"]
    rb, rt = results["bridge/retriever"], results["two-state/retriever"]
    over_b, over_t = rb["peak_mb"] - rb["loaded_mb"], rt["peak_mb"] - rt["loaded_mb"]
    ratios = {
        "peak_mb/bridge_over_search-r1": b["peak_mb"] / s["peak_mb"],
        "seconds/bridge_over_search-r1": b["seconds"] / s["seconds"],
        "peak_mb/bridge_over_second-order": b["peak_mb"] / so["peak_mb"],
        "peak_mb/two-state_over_bridge": two["peak_mb"] / b["peak_mb"],
        "seconds/two-state_over_bridge": two["seconds"] / b["seconds"],
        "over_load_mb/two-state_over_bridge@retriever_update": over_t / max(over_b, 1),
        "seconds/two-state_over_bridge@retriever_update": rt["seconds"] / rb["seconds"],
    }
    if gpu:  # on a GPU the host RSS says little; the device's own peak is the memory figure
        ratios["gpu_peak_mb/bridge_over_search-r1"] = b["gpu_peak_mb"] / s["gpu_peak_mb"]
    print(f"\nbridge / search-r1 peak memory: {ratios['peak_mb/bridge_over_search-r1']:.2f}x (target <= 1.10x)")
    print(f"bridge / search-r1 seconds: {ratios['seconds/bridge_over_search-r1']:.2f}x")
    print(f"bridge / second-order peak memory: {ratios['peak_mb/bridge_over_second-order']:.2f}x (target < 1.0x)")
    print(f"two-state / bridge round: peak memory {ratios['peak_mb/two-state_over_bridge']:.2f}x, "
          f"seconds {ratios['seconds/two-state_over_bridge']:.2f}x")  # fmt: skip
    print(f"retriever update, two-state / bridge: memory over load "
          f"{ratios['over_load_mb/two-state_over_bridge@retriever_update']:.2f}x "
          f"({over_t:.0f} vs {over_b:.0f} MB), seconds {ratios['seconds/two-state_over_bridge@retriever_update']:.2f}x "
          f"(paper: 62.3 vs 31.3 GiB = 1.99x, 104.5 vs 46.2 s = 2.26x)")  # fmt: skip
    return ratios


def main(argv: list[str] | None = None) -> None:
    parser = script_parser(__doc__)
    parser.add_argument("--one", help=argparse.SUPPRESS)
    parser.add_argument("--batch", type=Path, help="Reuse (or create) the batch file here.")
    parser.add_argument("--retriever-params", choices=["full", "lora"], default="full",
                        help="What the retriever trains: the query tower, or a query-side LoRA.")  # fmt: skip
    parser.add_argument("--q-steps", type=int, help="Q subsample: search steps scored by Q_theta (config default).")
    parser.add_argument("--device", default="auto", help="Where the rounds train: auto (a CUDA GPU when torch "
                        "sees one), cpu, cuda, cuda:N.")  # fmt: skip
    add_repeat_arguments(parser, "train_round", cost="Long: one repetition (six rounds, each in a fresh process) "
                         "is ~15 min on 2 CPU cores, so the default 3 take ~45 min.")  # fmt: skip
    args = parser.parse_args(argv)
    if args.one:
        print(json.dumps(run_one(args.one, models_in(args.work), args.batch, args.retriever_params, args.q_steps,
                                 args.device)))  # fmt: skip
        return
    started = time.perf_counter()
    models = prepare_models(args.work)
    batch_file = args.batch or Path(tempfile.mkdtemp()) / "batch.json"
    if not batch_file.exists():
        make_batch_file(models, batch_file)
    results_by_repeat: list[dict] = []
    runs = repeat(lambda _: measure_rows(args, batch_file, results_by_repeat), args.repeat)
    context = {"retriever_params": args.retriever_params, "device": results_by_repeat[0]["bridge"]["device"]}
    finish("train_round", args, runs, started, context=context, argv=argv)


if __name__ == "__main__":
    main()
