"""Adam whose state outlives a round: warm-up + schedule, gradient-norm clipping, and save/load as safetensors.

A round runs in whichever worker picks it up, so each optimizer's moments and step count are written with the
round and restored by the next one; two rounds of one step then equal one process taking both steps.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from services.trainer.algo.config import AlgoConfig


def lr_factor(step: int, total_steps: int, warmup_steps: int, schedule: str) -> float:
    """Multiplier of the base learning rate at optimizer step `step` (0-based): linear warm-up over
    `warmup_steps`, then constant or linear decay to 0 at `total_steps` (transformers' linear schedule)."""
    if step < warmup_steps:
        return (step + 1) / warmup_steps
    if schedule == "constant":
        return 1.0
    return max(0.0, (total_steps - step) / max(1, total_steps - warmup_steps))


class TrainOptimizer:
    """torch.optim.Adam over `params` with the run's schedule and clipping; `steps` counts every step taken."""

    def __init__(
        self,
        params: list[torch.nn.Parameter],
        lr: float,
        *,
        total_steps: int = 1,
        warmup_ratio: float = 0.0,
        schedule: str = "constant",
        max_grad_norm: float = 0.0,
    ) -> None:
        self.params = params
        self.base_lr = lr
        self.total_steps = max(1, total_steps)
        self.warmup_steps = math.ceil(warmup_ratio * self.total_steps)
        self.schedule = schedule
        self.max_grad_norm = max_grad_norm
        self.adam = torch.optim.Adam(params, lr=lr)
        self.steps = 0

    @classmethod
    def for_level(cls, params: list[torch.nn.Parameter], cfg: AlgoConfig, lr: float, steps_per_round: int,
                  rounds: int) -> TrainOptimizer:  # fmt: skip
        return cls(params, lr, total_steps=steps_per_round * rounds, warmup_ratio=cfg.warmup_ratio,
                   schedule=cfg.lr_schedule, max_grad_norm=cfg.max_grad_norm)  # fmt: skip

    def rebind(self, params: list[torch.nn.Parameter]) -> None:
        """Same moments and step count, new parameter objects of the same shapes, in the same order."""
        state = self.adam.state_dict()
        self.params = params
        self.adam = torch.optim.Adam(params, lr=self.base_lr)
        self.adam.load_state_dict(state)

    def zero_grad(self) -> None:
        self.adam.zero_grad(set_to_none=True)

    @property
    def lr(self) -> float:
        return self.base_lr * lr_factor(self.steps, self.total_steps, self.warmup_steps, self.schedule)

    def step(self) -> float:
        """Clip, step at this step's learning rate; returns the gradient norm before clipping."""
        with_grad = [p for p in self.params if p.grad is not None]
        if not with_grad:
            return 0.0
        limit = self.max_grad_norm if self.max_grad_norm > 0 else float("inf")
        grad_norm = float(torch.nn.utils.clip_grad_norm_(with_grad, limit))
        for group in self.adam.param_groups:
            group["lr"] = self.lr
        self.adam.step()
        self.steps += 1
        return grad_norm

    # ------------------------------------------------------------------ persistence (no pickles)
    def save(self, path: Path) -> None:
        state = self.adam.state_dict()
        tensors = {
            f"{index}.{name}": value.detach().contiguous()
            for index, per_param in state["state"].items()
            for name, value in per_param.items()
            if isinstance(value, torch.Tensor)
        }
        meta = {"steps": str(self.steps), "param_groups": json.dumps(state["param_groups"])}
        tmp = path.with_name(path.name + ".tmp")
        save_file(tensors, str(tmp), metadata=meta)
        tmp.replace(path)

    def load(self, path: Path) -> None:
        """Restore moments and step count written by `save` for the same parameter list."""
        from safetensors import safe_open

        with safe_open(str(path), framework="pt") as fh:
            meta = fh.metadata() or {}
        tensors = load_file(str(path))
        per_param: dict[int, dict[str, torch.Tensor]] = {}
        for key, value in tensors.items():
            index, name = key.split(".", 1)
            per_param.setdefault(int(index), {})[name] = value
        if per_param and max(per_param) >= len(self.params):
            raise ValueError(f"optimizer state {path} has more parameters than the model it is loaded for")
        groups = json.loads(meta["param_groups"])
        self.adam.load_state_dict({"state": per_param, "param_groups": groups})
        self.steps = int(meta["steps"])


class RoundOptimizers:
    """The optimizers of one run as a round uses them (theta, phi, and z for two-state), built on first use over
    the parameters the round hands in, with the state the previous round saved in `resume_from`."""

    def __init__(self, cfg: AlgoConfig, rounds: int = 1, resume_from: Path | None = None) -> None:
        self.cfg = cfg
        self.rounds = rounds
        self.resume_from = resume_from
        self.built: dict[str, TrainOptimizer] = {}

    def get(self, name: str, params: list[torch.nn.Parameter]) -> TrainOptimizer:
        """The optimizer for `name` over `params`; z is a new copy of phi every round, so an optimizer built over
        an earlier copy moves its moments onto the new parameters."""
        params = list(params)
        if name in self.built:
            opt = self.built[name]
            if [id(p) for p in opt.params] != [id(p) for p in params]:
                opt.rebind(params)
            return opt
        cfg = self.cfg
        lr, steps = (cfg.policy_lr, cfg.policy_steps) if name == "policy" else (cfg.retriever_lr, cfg.retriever_steps)
        opt = TrainOptimizer.for_level(params, cfg, lr, steps, self.rounds)
        if self.resume_from is not None and (path := self.resume_from / f"{name}.safetensors").exists():
            opt.load(path)
        self.built[name] = opt
        return opt

    def save(self, folder: Path) -> None:
        folder.mkdir(parents=True, exist_ok=True)
        for name, opt in self.built.items():
            opt.save(folder / f"{name}.safetensors")
