"""A continuous evaluation metric: the policy's teacher-forced log-probability of the gold answer.

For each evaluated question, take the greedy trajectory the policy produced (its prompt, its searches and the
passages it was shown) up to where it opened its answer, append ` <gold> </answer>`, and score the gold answer's
tokens under the evaluated checkpoint: log pi(y* | x, passages shown). The context and the answer are tokenized as
ONE string and split where the answer starts (`services.modeling.tokens.split_ids`, as Q_theta does), so the
scored tokens are those the policy would write. Unlike EM it moves when the policy gets closer to the answer
without reaching it, and it is deterministic (no sampling), so it needs no repeated answers.

Computed in-process with transformers (and peft for a LoRA adapter) from the checkpoint's folders: batched,
left-padded, and only the answer positions' logits are computed.

    python -m services.eval.logprob --model-dir <base> [--adapter <lora dir>] --trajectories <eval>/trajectories.jsonl
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from pathlib import Path

from pydantic import BaseModel

ANSWER_OPEN = "<answer>"


class LogprobInput(BaseModel):
    """One question's scoring input: the trajectory's text up to and including `<answer>`, and ` y* </answer>`."""

    dataset: str
    id: str
    context: str
    answer: str


class AnswerLogprob(BaseModel):
    """sum_t log pi(y*_t | context, y*_<t) over the answer's `tokens` tokens (a line of logprob.jsonl)."""

    dataset: str
    id: str
    logprob: float
    tokens: int


def answer_context(prompt: str, generated: str) -> str:
    """What the policy had written when it opened its (last) answer: the prompt, then everything generated and
    shown up to and including the last `<answer>`. A trajectory that never opened one gets `<answer>` appended to
    all it wrote, so every question is scored (from where its answer would have started)."""
    cut = generated.rfind(ANSWER_OPEN)
    if cut < 0:
        return prompt + generated + ANSWER_OPEN
    return prompt + generated[: cut + len(ANSWER_OPEN)]


def gold_continuation(gold: str) -> str:
    """The gold answer as the warm start writes an answer: `<answer> X </answer>` (the context ends on `<answer>`)."""
    return f" {gold.strip()} </answer>"


def inputs_from_records(rows: Sequence[tuple[str, dict]], tokenizer) -> list[LogprobInput]:
    """(dataset, trajectory record as JSON) -> scoring inputs; the first gold answer is the one scored (Q_theta's
    choice). Records without gold answers are skipped."""
    from services.common.answers import trajectory_text
    from services.common.schemas.policy import TrajectoryRecord

    out = []
    for dataset, raw in rows:
        record = TrajectoryRecord.model_validate(raw)
        if not record.golden_answers:
            continue
        context = answer_context(record.prompt, trajectory_text(record, tokenizer))
        out.append(LogprobInput(dataset=dataset, id=record.item_id or record.id, context=context,
                                answer=gold_continuation(record.golden_answers[0])))  # fmt: skip
    return out


def load_policy(model_dir: Path, adapter_dir: Path | None = None, device: str | None = None, dtype=None):
    """(tokenizer, model) of a checkpoint: the base folder, with the LoRA adapter folder on top when given."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    dtype = dtype or (torch.bfloat16 if device.startswith("cuda") else torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=dtype)
    if adapter_dir is not None:
        from peft import PeftModel

        model = PeftModel.from_pretrained(model, str(adapter_dir))
    return tokenizer, model.to(device).eval()


def answer_logprobs(
    model_dir: Path | None,
    rows: Sequence[LogprobInput],
    *,
    adapter_dir: Path | None = None,
    batch_size: int = 8,
    progress: bool = True,
    policy=None,
) -> list[AnswerLogprob]:
    """log pi(y* | context) for every row, in the order given. `policy`: an already loaded (tokenizer, model), else
    `load_policy(model_dir, adapter_dir)`. Rows are batched by length; each batch is one left-padded forward
    (position ids from the mask, so padding changes nothing) that computes logits for the answer positions only."""
    import torch
    from tqdm import tqdm

    from services.modeling.tokens import split_ids

    tokenizer, model = policy or load_policy(model_dir, adapter_dir)
    device = next(model.parameters()).device
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    encoded = [split_ids(tokenizer, row.context, row.answer) for row in rows]
    order = sorted(range(len(rows)), key=lambda i: len(encoded[i][0]) + len(encoded[i][1]))
    scores: dict[int, float] = {}
    with tqdm(total=len(rows), desc="gold log-prob", unit="q", disable=not progress) as bar:
        for start in range(0, len(order), batch_size):
            batch = order[start : start + batch_size]
            seqs = [encoded[i][0] + encoded[i][1] for i in batch]
            n_answer = [len(encoded[i][1]) for i in batch]
            width, keep = max(len(s) for s in seqs), max(n_answer) + 1
            input_ids = torch.full((len(batch), width), pad, dtype=torch.long)  # (B, L)
            attention_mask = torch.zeros((len(batch), width), dtype=torch.long)  # (B, L)
            for b, seq in enumerate(seqs):
                input_ids[b, width - len(seq) :] = torch.tensor(seq)
                attention_mask[b, width - len(seq) :] = 1
            position_ids = (attention_mask.cumsum(-1) - 1).clamp(min=0)
            with torch.no_grad():
                logits = model(input_ids=input_ids.to(device), attention_mask=attention_mask.to(device),
                               position_ids=position_ids.to(device),
                               logits_to_keep=keep).logits[:, :-1].float()  # (B, keep - 1, V)  # fmt: skip
            b_logps = torch.log_softmax(logits, dim=-1)
            targets = input_ids[:, width - (keep - 1) :].to(device)  # (B, keep - 1): the last keep - 1 tokens
            per_token_logps = b_logps.gather(-1, targets[..., None])[..., 0]  # (B, keep - 1)
            for b, i in enumerate(batch):
                scores[i] = float(per_token_logps[b, per_token_logps.shape[1] - n_answer[b] :].sum())
            bar.update(len(batch))
    return [AnswerLogprob(dataset=row.dataset, id=row.id, logprob=scores[i], tokens=len(encoded[i][1]))
            for i, row in enumerate(rows)]  # fmt: skip


def read_trajectories(path: Path) -> list[tuple[str, dict]]:
    """trajectories.jsonl: one `{"dataset", "record"}` line per greedy evaluation answer."""
    return [(row["dataset"], row["record"]) for row in map(json.loads, path.read_text().splitlines()) if row]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model-dir", type=Path, required=True, help="The base (or merged) policy folder.")
    parser.add_argument("--adapter", type=Path, default=None, help="A LoRA adapter folder (a policy checkpoint).")
    parser.add_argument("--trajectories", type=Path, required=True, help="An evaluation's trajectories.jsonl.")
    parser.add_argument("--out", type=Path, default=None, help="Default: logprob.jsonl next to --trajectories.")
    parser.add_argument("--batch-size", type=int, default=8)
    args = parser.parse_args()
    policy = load_policy(args.model_dir, args.adapter)
    rows = inputs_from_records(read_trajectories(args.trajectories), policy[0])
    results = answer_logprobs(None, rows, batch_size=args.batch_size, policy=policy)
    out = args.out or args.trajectories.with_name("logprob.jsonl")
    out.write_text("".join(r.model_dump_json() + "\n" for r in results))
    mean = sum(r.logprob for r in results) / max(len(results), 1)
    print(f"{len(results)} questions, mean log pi(y*|x, passages) {mean:.3f} -> {out}")


if __name__ == "__main__":
    main()
