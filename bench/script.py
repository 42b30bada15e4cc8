"""The common header of every bench and experiment command (`python -m bench.<name>`, `python -m experiments.<name>`,
run from the repository root): a parser with the module's docstring as help and the usual flags, the tiny models
prepared once under the work folder, seeds, and where data and results live.

    parser = script_parser(__doc__, seed=0, out=RESULTS / "order.json")
    parser.add_argument("--questions", type=int, default=6)
    args = parser.parse_args()
    models = prepare_models(args.work)       # models.policy, models.retriever: model folders
    seed_all(args.seed)
"""

from __future__ import annotations

import argparse
import random
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DEMO_DATA = REPO / "services" / "demo_data"  # the shipped hotpotqa questions and corpus
SHARED_DATA = REPO.parent / "shared" / "data"  # the full corpus and QA files, where a checkout has them
RESULTS = REPO / "experiments" / "results"
WORK = REPO / ".cache" / "bench"
POLICY_MODEL = "SmolLM2-135M-Instruct"
RETRIEVER_MODEL = "all-MiniLM-L6-v2"


def script_parser(doc: str | None, *, seed: int | None = None, out: Path | None = None) -> argparse.ArgumentParser:
    """`--work` always; `--seed` when `seed` is given (its default), `--out` when `out` is (its default)."""
    parser = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--work", type=Path, default=WORK,
                        help="Cache folder: the models under <work>/models, batches, embeddings.")  # fmt: skip
    if seed is not None:
        parser.add_argument("--seed", type=int, default=seed)
    if out is not None:
        parser.add_argument("--out", type=Path, default=out, help="Where the results are written.")
    return parser


@dataclass(frozen=True)
class Models:
    """The tiny models' folders under one root."""

    root: Path

    @property
    def policy(self) -> Path:
        return self.root / POLICY_MODEL

    @property
    def retriever(self) -> Path:
        return self.root / RETRIEVER_MODEL


def models_in(work: Path) -> Models:
    return Models(work / "models")


def prepare_models(work: Path, *, policy: bool = True, retriever: bool = True) -> Models:
    """Download (once) and prepare the retriever encoder and the policy model under `<work>/models`."""
    from services.cli.prepare import prepare_policy_model, prepare_retriever_model

    models = models_in(work)
    if retriever:
        prepare_retriever_model(models.retriever)
    if policy:
        prepare_policy_model(models.policy)
    return models


def seed_all(seed: int) -> None:
    """Python's, numpy's global and torch's generators."""
    import numpy as np
    import torch

    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def run_module(module: str, *args: str) -> str:
    """Run `python -m <module> <args>` from the repository root in a fresh process (a row's own peak memory);
    its stdout."""
    command = [sys.executable, "-m", module, *args]
    return subprocess.run(command, cwd=REPO, capture_output=True, text=True, check=True).stdout
