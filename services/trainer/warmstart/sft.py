"""The warm start's training loop: a weighted SFT of a LoRA that resumes from its last checkpoint.

- The loss weights each agent token: the answer's tokens by 1 and the rest of the agent's turns (thoughts, tags, the
  search query) by `template_weight`, normalised by the summed weights of the step, so reading, not the template,
  drives the gradient. Logits are computed only where a weighted token is predicted (`logits_to_keep`): the LM head
  over 49k words at every position was a fifth of the step's work for nothing.
- The state (LoRA weights, AdamW moments, the schedule, the step, the curves) is written atomically to
  `<state_dir>/checkpoint` every few minutes, at the end, on Ctrl-C or SIGTERM and when the time budget runs out; a run
  started again with `resume` goes on from it with the same example order, so a run longer than one session costs
  at most the minutes since its last save.
- A run may also go on from a committed adapter of itself (`continued`): a new machine keeps only what git holds, and
  an adapter holds the LoRA and the step but not AdamW's moments, so those restart there with a fresh warm-up.
"""

from __future__ import annotations

import json
import math
import random
import shutil
import signal
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, Field

if TYPE_CHECKING:
    from services.trainer.device import Placement
    from services.trainer.warmstart.config import WarmstartConfig
    from services.trainer.warmstart.examples import SFTExample

CHECKPOINT = "checkpoint"
STATE_FILE = "state.json"
LORA_FILE = "lora.pt"
OPTIMIZER_FILE = "optimizer.pt"


class SFTState(BaseModel):
    """Where a run stands; saved with every checkpoint."""

    step: int = 0
    total_steps: int = 0
    examples_seen: int = 0
    tokens_seen: int = 0
    wall_s: float = Field(0.0, description="Training seconds over every session of the run")
    curve: list[dict[str, float]] = Field(default_factory=list)
    heldout: list[dict[str, float]] = Field(default_factory=list)
    sessions: list[dict[str, float]] = Field(default_factory=list, description="Per start: first and last step, s")
    restarted_at: int | None = Field(
        None, description="The step a continuation from an adapter began at: AdamW restarted there, warming up again"
    )
    prior_curve: list[dict[str, float]] = Field(
        default_factory=list, description="The adapter's summarised loss curve, before `restarted_at`"
    )

    @property
    def done(self) -> bool:
        return self.total_steps > 0 and self.step >= self.total_steps


def token_weights(example: SFTExample, template_weight: float) -> list[float]:
    """Per token: 0 outside the agent's turns, 1 on the answer, `template_weight` on the rest of the agent's turns
    (an example with no answer mask, or a weight of 1, is the plain agent-token loss)."""
    if example.answer_mask is None or template_weight >= 1.0:
        return [float(m) for m in example.loss_mask]
    return [
        m * (template_weight + (1.0 - template_weight) * a)
        for m, a in zip(example.loss_mask, example.answer_mask, strict=True)
    ]


def token_nll(model: Any, input_ids: Sequence[int], positions: Sequence[int], placement: Placement) -> Any:
    """The NLL of token t+1 for each t in `positions`, with logits only there (P,)."""
    import torch

    ids = torch.tensor([list(input_ids)], device=placement.device)  # (1, T)
    keep = torch.tensor(list(positions), device=placement.device)  # (P,)
    with placement.forward():
        logits = model(input_ids=ids, logits_to_keep=keep).logits  # (1, P, V)
    logps = torch.log_softmax(logits[0].float(), dim=-1)  # (P, V)
    return -logps.gather(-1, ids[0, keep + 1].unsqueeze(-1)).squeeze(-1)


def weighted_nll(
    model: Any, input_ids: Sequence[int], weights: Sequence[float], placement: Placement
) -> tuple[Any, Any]:
    """Summed weighted next-token NLL and the summed weights; logits only at the positions that predict a weighted
    token (position t predicts token t+1)."""
    import torch

    positions = [t for t in range(len(input_ids) - 1) if weights[t + 1] > 0]
    w = torch.tensor([weights[t + 1] for t in positions], device=placement.device)  # (P,)
    return (token_nll(model, input_ids, positions, placement) * w).sum(), w.sum()


def question_key(example: SFTExample) -> str:
    return f"{example.dataset}:{example.id}"


def training_order(
    groups: Sequence[Sequence[SFTExample]], epochs: float, seed: int, first: Sequence[str] = ()
) -> list[SFTExample]:
    """Each epoch visits every question once, with its next variant (epoch e takes variant e mod the question's
    count), in a seeded shuffle; `epochs` may be fractional. Deterministic, so a resumed run sees the same order.
    `first` ('dataset:id' keys): the questions an earlier session already trained on, in its order, which open the
    first epoch (a continuation from an adapter whose examples were rebuilt elsewhere: its order goes on unchanged,
    and nothing it saw is seen again in the epoch). A key listed n times takes n of that question's visits (a run
    that repeats its two-search variants visits such a question more than once an epoch); listing it more often
    than the epoch holds it means the adapter trained past its first epoch, which only its own state can resume."""
    rng = random.Random(seed)
    order: list[SFTExample] = []
    for epoch in range(math.ceil(epochs)):
        visit = [group[epoch % len(group)] for group in groups]
        if epoch == 0 and first:
            by_key: dict[str, list[SFTExample]] = {}
            for e in visit:
                by_key.setdefault(question_key(e), []).append(e)
            head = []
            for k in first:
                if k not in by_key:  # not in this build (e.g. too long here): it is simply not trained on again
                    continue
                if not by_key[k]:
                    raise ValueError(f"{k} was seen more often than one epoch visits it: the adapter trained past "
                                     "its first epoch; continue it on the machine that holds its state")  # fmt: skip
                head.append(by_key[k].pop(0))
            rest = [e for pending in by_key.values() for e in pending]
            rng.shuffle(rest)
            visit = head + rest
        else:
            rng.shuffle(visit)
        order += visit
    return order[: round(len(groups) * epochs)]


def lr_factor(step: int, warmup: int, total: int, restarted_at: int | None = None) -> float:
    """Linear warm-up, then cosine decay to 10 %; from `restarted_at` (fresh AdamW moments) the same warm-up again,
    onto the schedule where it stands."""
    if step < warmup:
        return (step + 1) / (warmup + 1)
    progress = (step - warmup) / max(1, total - warmup)
    factor = 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(progress, 1.0)))
    if restarted_at is not None and restarted_at <= step < restarted_at + warmup:
        factor *= (step - restarted_at + 1) / (warmup + 1)
    return factor


def heldout_losses(
    model: Any, examples: Sequence[SFTExample], template_weight: float, placement: Placement
) -> dict[str, float]:
    """The training loss (weighted) and the answer's own NLL per token, over held-out examples (one forward each)."""
    import torch

    total = weight = answer = answer_n = 0.0
    model.eval()
    with torch.no_grad():
        for example in examples:
            weights = token_weights(example, template_weight)
            answers = example.answer_mask or [0] * len(example.input_ids)
            positions = [t for t in range(len(example.input_ids) - 1) if weights[t + 1] > 0]
            nll = token_nll(model, example.input_ids, positions, placement).tolist()
            total += sum(n * weights[t + 1] for n, t in zip(nll, positions, strict=True))
            weight += sum(weights[t + 1] for t in positions)
            answer += sum(n for n, t in zip(nll, positions, strict=True) if answers[t + 1])
            answer_n += sum(answers[t + 1] for t in positions)
    model.train()
    return {"loss": total / max(weight, 1e-9), "answer_loss": answer / max(answer_n, 1e-9)}


def trainable_state(model: Any) -> dict[str, Any]:
    return {name: p.detach().clone() for name, p in model.named_parameters() if p.requires_grad}


def save_checkpoint(state_dir: Path, model: Any, optimizer: Any, scheduler: Any, state: SFTState) -> None:
    """Write the checkpoint to a staging folder, then swap it in: a crash leaves the old one or the new one."""
    import torch

    staging, final, old = (state_dir / f".{CHECKPOINT}.tmp", state_dir / CHECKPOINT, state_dir / f".{CHECKPOINT}.old")
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    torch.save(trainable_state(model), staging / LORA_FILE)
    torch.save({"optimizer": optimizer.state_dict(), "scheduler": scheduler.state_dict()}, staging / OPTIMIZER_FILE)
    (staging / STATE_FILE).write_text(state.model_dump_json(indent=1) + "\n")
    shutil.rmtree(old, ignore_errors=True)
    if final.exists():
        final.replace(old)
    staging.replace(final)
    shutil.rmtree(old, ignore_errors=True)


def checkpoint_folder(state_dir: Path) -> Path | None:
    """The last complete checkpoint (the previous one when a crash came between the two renames)."""
    for name in (CHECKPOINT, f".{CHECKPOINT}.old"):
        folder = state_dir / name
        if (folder / STATE_FILE).exists():
            return folder
    return None


def read_state(folder: Path) -> SFTState:
    return SFTState.model_validate_json((folder / STATE_FILE).read_text())


def load_checkpoint(folder: Path, model: Any, optimizer: Any, scheduler: Any) -> None:
    import torch

    weights = torch.load(folder / LORA_FILE, map_location="cpu", weights_only=True)
    params = dict(model.named_parameters())
    missing = [name for name in weights if name not in params]
    if missing:
        raise ValueError(f"{folder}: checkpoint does not fit this model (e.g. {missing[0]})")
    with torch.no_grad():
        for name, value in weights.items():
            params[name].copy_(value)
    opt = torch.load(folder / OPTIMIZER_FILE, map_location="cpu", weights_only=True)
    optimizer.load_state_dict(opt["optimizer"])
    scheduler.load_state_dict(opt["scheduler"])


def train(
    model: Any,
    groups: Sequence[Sequence[SFTExample]],
    heldout: Sequence[SFTExample],
    config: WarmstartConfig,
    placement: Placement,
    state_dir: Path,
    resume: bool = False,
    save_every_s: float = 300.0,
    continued: SFTState | None = None,
    first: Sequence[str] = (),
) -> SFTState:
    """Weighted LoRA SFT over `groups` (one list of variants per question), `config.batch_size` examples a step,
    resumable from `state_dir`. Stops at the end of the schedule or after `config.max_minutes` of this session.
    `continued`: where the committed adapter already in `model` stopped (its step, counts and curves), used when
    `state_dir` has no checkpoint to resume; `first`: the questions it trained on, in its order (`training_order`)."""
    import torch
    from tqdm import tqdm

    torch.manual_seed(config.seed)
    total = math.ceil(round(len(groups) * config.epochs) / config.batch_size)
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=config.lr, weight_decay=0.0)
    folder = checkpoint_folder(state_dir) if resume else None
    if folder is not None:
        state = read_state(folder)
        if state.total_steps != total:
            raise ValueError(f"{state_dir}: the checkpoint planned {state.total_steps} steps, this config {total}")
    elif continued is not None:
        if continued.step > total:
            raise ValueError(f"the adapter is at step {continued.step}, past this config's {total} steps")
        state = continued.model_copy(update={"total_steps": total, "restarted_at": continued.step})
    else:
        state = SFTState(total_steps=total)
    for group in optimizer.param_groups:
        group.setdefault("initial_lr", config.lr)  # lets the schedule start at a continuation's step
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer,
        lambda s: lr_factor(s, config.warmup_steps, total, state.restarted_at),
        last_epoch=state.step - 1 if folder is None else -1,
    )
    if folder is not None:
        load_checkpoint(folder, model, optimizer, scheduler)
    order = training_order(groups, config.epochs, config.seed, first)
    weight = config.template_weight
    if heldout and not state.heldout:
        state.heldout.append(
            {"step": 0, "examples": 0, "tokens": 0, **heldout_losses(model, heldout, weight, placement)}
        )
    first_step, started, last_save = state.step, time.monotonic(), time.monotonic()
    wall_before = state.wall_s
    state.sessions.append({"from": first_step, "to": first_step, "s": 0.0})

    def checkpoint() -> None:
        state.wall_s = wall_before + time.monotonic() - started
        state.sessions[-1] = {"from": first_step, "to": state.step, "s": round(time.monotonic() - started, 1)}
        save_checkpoint(state_dir, model, optimizer, scheduler, state)

    model.train()
    previous = _stop_on_sigterm()
    try:
        with tqdm(total=total, initial=state.step, desc="warm-start SFT", unit="step") as bar:
            while state.step < total:
                batch = order[state.step * config.batch_size : (state.step + 1) * config.batch_size]
                weights = [token_weights(e, weight) for e in batch]
                norm = max(sum(sum(w[1:]) for w in weights), 1e-9)
                step_loss = 0.0
                for example, w in zip(batch, weights, strict=True):
                    loss, _ = weighted_nll(model, example.input_ids, w, placement)
                    (loss / norm).backward()
                    step_loss += float(loss.detach())
                torch.nn.utils.clip_grad_norm_(params, 1.0)
                optimizer.step()
                scheduler.step()
                optimizer.zero_grad(set_to_none=True)
                state.step += 1
                state.examples_seen += len(batch)
                state.tokens_seen += sum(len(e.input_ids) for e in batch)
                state.curve.append(
                    {"step": state.step, "examples": state.examples_seen, "tokens": state.tokens_seen,
                     "loss": step_loss / norm}
                )  # fmt: skip
                elapsed = time.monotonic() - started
                bar.set_postfix(
                    loss=f"{state.curve[-1]['loss']:.3f}", s_step=f"{elapsed / (state.step - first_step):.1f}"
                )
                bar.update(1)
                out_of_time = config.max_minutes is not None and elapsed > config.max_minutes * 60
                last = state.step == total
                if heldout and (state.step % config.eval_every == 0 or last or out_of_time):
                    held = heldout_losses(model, heldout, weight, placement)
                    state.heldout.append(
                        {"step": state.step, "examples": state.examples_seen, "tokens": state.tokens_seen, **held}
                    )
                    bar.write(f"step {state.step}: held-out loss {held['loss']:.4f}, answer {held['answer_loss']:.4f}")
                if last or out_of_time or time.monotonic() - last_save > save_every_s:
                    checkpoint()
                    last_save = time.monotonic()
                if out_of_time:
                    break
    except KeyboardInterrupt:
        checkpoint()
        raise
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)
    return state


def _stop_on_sigterm() -> Any:
    """SIGTERM (a `kill`, a container stop; a background job ignores Ctrl-C's SIGINT) stops training the way
    Ctrl-C does: the checkpoint is written first. Returns the handler it replaced (None off the main thread)."""
    if threading.current_thread() is not threading.main_thread():
        return None

    def interrupt(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt(f"signal {signum}")

    return signal.signal(signal.SIGTERM, interrupt)


def write_state_files(state_dir: Path, config: WarmstartConfig, examples: Sequence[SFTExample]) -> None:
    state_dir.mkdir(parents=True, exist_ok=True)
    (state_dir / "examples.jsonl").write_text("".join(e.model_dump_json() + "\n" for e in examples))
    (state_dir / "config.json").write_text(json.dumps(config.model_dump(exclude={"max_minutes"}), indent=1) + "\n")
