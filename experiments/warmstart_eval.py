"""Measure a policy in `agent` mode with the initial-search scaffold off, in-process: the policy service's own
agent loop (services/policy/agent.py: prompt, stops, <information> formatting, parsing) over a batched
transformers engine and the retriever service's own code (services.retriever.inprocess.InProcessRetriever).

Reports per dataset: the share of questions that close an <answer>, the share with a well-formed <search>,
searches per question, the share with a second search, how often the first search copies the question, Search-R1's
format validity (qa_em_format's is_valid_sequence), recall of the supporting passages over all searches, EM and F1.
Evaluation refuses questions the warm-start adapter trained on (its manifest lists them).

    python -m experiments.warmstart_eval --model-dir <merged policy> --index-dir .cache/warmstart-data \
        --qa-dir ../shared/data/qa --out eval-warmstart.json
"""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Annotated

import typer

from bench.script import SHARED_DATA
from services.policy.backends.engine import Engine, Generation, SamplingSpec

app = typer.Typer(add_completion=False)


class BatchedTransformersEngine(Engine):
    """Greedy transformers generation that batches the concurrent `generate` calls of one agent turn (the agent
    loop issues them together) into one left-padded `generate`. The tokenizer pads with EOS (= <|im_end|> in
    SmolLM2), so each row is cut at its first EOS and then at its first stop string."""

    def __init__(self, model_dir: str, batch_size: int = 32) -> None:
        from transformers import AutoTokenizer

        self.model_dir = model_dir
        self.batch_size = batch_size
        self.tokenizer = AutoTokenizer.from_pretrained(model_dir)
        self.model = None
        self._pending: list[tuple[list[int], SamplingSpec, asyncio.Future]] = []
        self._flush_scheduled = False

    async def start(self) -> None:
        import torch
        from transformers import AutoModelForCausalLM

        self.model = AutoModelForCausalLM.from_pretrained(self.model_dir, dtype=torch.bfloat16).eval()

    async def stop(self) -> None:
        self.model = None

    async def load_adapter(self, name: str, path: Path) -> None:
        raise NotImplementedError("merge adapters first (bridge-rl prepare)")

    async def unload_adapter(self, name: str) -> None:
        raise NotImplementedError

    async def generate(self, prompt_ids: list[int], spec: SamplingSpec, adapter: str) -> Generation:
        future = asyncio.get_running_loop().create_future()
        self._pending.append((prompt_ids, spec, future))
        if not self._flush_scheduled:
            self._flush_scheduled = True
            asyncio.get_running_loop().call_later(0.01, lambda: asyncio.ensure_future(self._flush()))
        return await future

    async def _flush(self) -> None:
        pending, self._pending, self._flush_scheduled = self._pending, [], False
        groups: dict[tuple, list] = {}
        for entry in pending:
            groups.setdefault((entry[1].max_tokens, entry[1].stop), []).append(entry)
        for (max_tokens, stop), entries in groups.items():
            entries.sort(key=lambda e: len(e[0]))
            for start in range(0, len(entries), self.batch_size):
                chunk = entries[start : start + self.batch_size]
                try:
                    outs = await asyncio.to_thread(self._generate_batch, [e[0] for e in chunk], max_tokens, stop)
                except Exception as exc:  # handed to every waiting caller
                    for e in chunk:
                        e[2].set_exception(exc)
                    continue
                for e, out in zip(chunk, outs, strict=True):
                    e[2].set_result(out)

    def _generate_batch(self, prompts: list[list[int]], max_tokens: int, stop: tuple[str, ...]) -> list[Generation]:
        import torch

        pad = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else self.tokenizer.eos_token_id
        width = max(len(p) for p in prompts)
        input_ids = torch.tensor([[pad] * (width - len(p)) + p for p in prompts])  # (B, T) left-padded
        attention = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])  # (B, T)
        with torch.inference_mode():
            out = self.model.generate(
                input_ids=input_ids,
                attention_mask=attention,
                max_new_tokens=max_tokens,
                do_sample=False,
                stop_strings=list(stop),
                tokenizer=self.tokenizer,
                pad_token_id=pad,
            )
        results = []
        eos = self.tokenizer.eos_token_id
        for row in out[:, width:].tolist():
            ids = row[: row.index(eos)] if eos in row else row
            finish = "stop" if eos in row else "length"
            for end in range(1, len(ids) + 1):
                text = self.tokenizer.decode(ids[:end])
                if any(text.endswith(s) for s in stop):
                    ids, finish = ids[:end], "stop"
                    break
            results.append(Generation(ids, [0.0] * len(ids), self.tokenizer.decode(ids), finish))
        return results


def _stats(rows: list[dict]) -> dict[str, float]:
    n = len(rows)
    recalls = [r["recall"] for r in rows if r["recall"] is not None]
    mean = lambda key: round(sum(r[key] for r in rows) / n, 4)  # noqa: E731
    return {
        "n": n,
        "answered": mean("answered"),
        "well_formed_search": mean("well_formed_search"),
        "searches": mean("searches"),
        "second_search": mean("second_search"),
        "copies_question": mean("copies_question"),
        "valid_format": mean("valid_format"),
        "recall": round(sum(recalls) / len(recalls), 4) if recalls else None,
        "em": mean("em"),
        "f1": mean("f1"),
    }


async def _measure(model_dir: str, index_dir: Path, items, max_turns: int, max_new_tokens: int, batch_size: int):
    from services.common.answers import exact_match, f1_score, trajectory_text, valid_search_r1_sequence
    from services.modeling.prompt import parse_search
    from services.policy.agent import AgentRunner, AgentTask, RetrievalSpec
    from services.retriever.inprocess import InProcessRetriever

    engine = BatchedTransformersEngine(model_dir, batch_size=batch_size)
    await engine.start()
    async with InProcessRetriever(index_dir) as retriever:
        runner = AgentRunner(engine, retriever, max_new_tokens=max_new_tokens, max_model_len=4096)
        results = await runner.run(
            [AgentTask(question=i.question, item_id=i.id, golden_answers=i.golden_answers) for i in items],
            adapter="base",
            policy_version="measure",
            temperature=0.0,
            max_turns=max_turns,
            retrieval=RetrievalSpec(top_k=3, candidates=3),
            initial_search=False,
        )
    rows = []
    for item, (record, _) in zip(items, results, strict=True):
        searches = [t.search for t in record.turns if t.search is not None]
        shown = {d for s in searches for d in s.chosen_ids}
        support = item.supporting_doc_ids
        first_query = searches[0].query if searches else ""
        rows.append(
            {
                "dataset": item.dataset,
                "id": item.id,
                "answer": record.answer,
                "answered": float(record.answer is not None),
                "well_formed_search": float(any(parse_search(t.text) for t in record.turns)),
                "searches": len(searches),
                "second_search": float(len(searches) >= 2),
                "copies_question": float(first_query.strip().lower() == item.question.strip().lower()),
                "valid_format": float(valid_search_r1_sequence(trajectory_text(record, engine.tokenizer))),
                "recall": sum(d in shown for d in support) / len(support) if support else None,
                "em": exact_match(record.answer, item.golden_answers),
                "f1": f1_score(record.answer, item.golden_answers),
                "queries": [s.query for s in searches],
            }
        )
    return rows


@app.command("in-process")
def in_process(
    model_dir: Annotated[Path, typer.Option(help="HF policy folder (the merged warm start, or the raw base).")],
    index_dir: Annotated[Path, typer.Option(help="Data dir of the in-process retriever (its index, models).")],
    qa_dir: Annotated[Path, typer.Option(help="Question files <dataset>.jsonl.")] = SHARED_DATA / "qa",
    datasets: Annotated[str, typer.Option(help="Comma-separated.")] = "nq,triviaqa,popqa,hotpotqa,2wikimultihopqa",
    limit: Annotated[int, typer.Option(help="The first N questions of each file (the evaluation split).")] = 100,
    max_turns: Annotated[int, typer.Option(help="Searches before the final answer turn.")] = 4,
    max_new_tokens: Annotated[int, typer.Option(help="Tokens per turn (docs/results.md used 64).")] = 64,
    batch_size: Annotated[int, typer.Option(help="Rows per generate call.")] = 32,
    out: Annotated[Path | None, typer.Option(help="Write per-question rows and the summary here (JSON).")] = None,
) -> None:
    """Agent mode, scaffold off, greedy: answered share, well-formed searches, EM/F1 per dataset."""
    from services.data.datasets import load_items
    from services.data.split import refuse_trained_questions
    from services.modeling.shipped import load_shipped_manifest

    names = [d.strip() for d in datasets.split(",") if d.strip()]
    items = [i for d in names for i in load_items(qa_dir, d, limit)]
    manifest = load_shipped_manifest()
    if manifest is not None:
        refuse_trained_questions([(i.dataset, i.id) for i in items], manifest)
    started = time.monotonic()
    rows = asyncio.run(_measure(str(model_dir), index_dir, items, max_turns, max_new_tokens, batch_size))
    wall = time.monotonic() - started
    summary = {d: _stats([r for r in rows if r["dataset"] == d]) for d in names}
    keys = ("answered", "well_formed_search", "second_search", "copies_question", "valid_format", "em", "f1")
    summary["mean"] = {k: round(sum(summary[d][k] or 0 for d in names) / len(names), 4) for k in keys}
    summary["wall_s"] = round(wall, 1)
    for name, stats in summary.items():
        typer.echo(f"{name:16} {stats}")
    if out is not None:
        out.write_text(json.dumps({"model_dir": str(model_dir), "summary": summary, "rows": rows}, indent=1))


def training_tokens(training: dict, row: dict) -> float:
    """Training tokens at a curve point of an adapter's manifest; a point recorded without its token count is placed
    at its examples times the run's mean tokens per example."""
    return row.get("tokens", row["examples"] * training["tokens_seen"] / max(training["examples_seen"], 1))


@app.command("plot-loss")
def plot_loss(
    adapter: Annotated[str, typer.Option(help="A shipped adapter's name (protocol, reading) or an adapter folder.")] = (
        "protocol"
    ),
    out: Annotated[Path, typer.Option(help="PNG to write.")] = Path("docs/warmstart/loss.png"),
) -> None:
    """An adapter's training loss (manifest summary) and held-out losses against training tokens, as a PNG. A
    point recorded without its token count is placed at its examples times the run's mean tokens per example."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from services.modeling.shipped import SHIPPED_ADAPTERS, verify_adapter

    manifest = verify_adapter(SHIPPED_ADAPTERS.get(adapter, Path(adapter)))
    training = manifest["training"]

    def tokens(row: dict) -> float:
        return training_tokens(training, row) / 1e3

    # a continued run keeps its earlier sessions' curve apart (`prior_loss_curve`): drawn as one line
    curve, held = training.get("prior_loss_curve", []) + training["loss_curve"], training["heldout_loss"]
    weighted = manifest["config"].get("template_weight", 1.0) < 1.0
    fig, ax = plt.subplots(figsize=(6.5, 3.8))
    label = "training (answer-weighted)" if weighted else "training (agent tokens)"
    ax.plot([tokens(c) for c in curve], [c["loss"] for c in curve], marker=".", label=label)
    ax.plot(
        [tokens(h) for h in held], [h["loss"] for h in held], marker="o", label=f"held-out {label.split(' ', 1)[1]}"
    )
    if all("answer_loss" in h for h in held):
        ax.plot(
            [tokens(h) for h in held], [h["answer_loss"] for h in held], marker="s", label="held-out, answer tokens"
        )
    ax.set(xlabel="training tokens (thousands)", ylabel="mean NLL per weighted token",
           title=f"warm-start SFT ({manifest['config'].get('recipe', 'protocol')} recipe)")  # fmt: skip
    ax.legend()
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=120)
    typer.echo(f"wrote {out}")


def oracle_em_by_tokens(specs: list[str]) -> dict[str, list[tuple[float, float]]]:
    """`TOKENS=RESULTS` specs -> dataset -> [(millions of training tokens, oracle EM)], sorted by tokens."""
    from experiments.reading_eval import read

    points: dict[str, list[tuple[float, float]]] = {}
    for spec in specs:
        tokens, sep, path = spec.partition("=")
        if not sep or not tokens.isdigit():
            raise typer.BadParameter(f"{spec!r}: expected TOKENS=RESULTS, e.g. 1788777=eval/results.jsonl")
        by_dataset: dict[str, list[float]] = {}
        for row in read(Path(path)):
            if row["mode"] == "oracle":
                by_dataset.setdefault(row["dataset"], []).append(float(row["em"]))
        for dataset, ems in by_dataset.items():
            points.setdefault(dataset, []).append((int(tokens) / 1e6, sum(ems) / len(ems)))
    return {dataset: sorted(xy) for dataset, xy in sorted(points.items())}


@app.command("plot-reading")
def plot_reading(
    oracle: Annotated[
        list[str],
        typer.Option(
            help="TOKENS=RESULTS: an oracle eval's results.jsonl(.gz) of the adapter after TOKENS training "
            "tokens (repeatable)."
        ),
    ],
    adapter: Annotated[str, typer.Option(help="The adapter whose held-out answer NLL is drawn.")] = "reading",
    out: Annotated[Path, typer.Option(help="PNG to write.")] = Path("docs/warmstart/reading-oracle.png"),
) -> None:
    """Issue 38's plot: the held-out answer NLL (the adapter's manifest) and oracle EM per dataset (eval files of
    its earlier checkpoints), both against training tokens."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from services.modeling.shipped import SHIPPED_ADAPTERS, verify_adapter

    training = verify_adapter(SHIPPED_ADAPTERS.get(adapter, Path(adapter)))["training"]
    held = [(training_tokens(training, h) / 1e6, h["answer_loss"]) for h in training["heldout_loss"]]
    points = oracle_em_by_tokens(oracle)
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 3.8))
    left.plot([x for x, _ in held], [y for _, y in held], marker="s")
    left.set(xlabel="training tokens (millions)", ylabel="nats per answer token",
             title="held-out answer NLL (held-out training questions)")  # fmt: skip
    for dataset, xy in points.items():
        right.plot([x for x, _ in xy], [y for _, y in xy], marker="o", label=dataset)
    right.axhline(0.40, color="grey", linestyle="--", linewidth=0.8, label="nq floor (issue 38)")
    right.set(xlabel="training tokens (millions)", ylabel="EM", title="oracle EM (evaluation split, n = 100)")
    right.legend(fontsize=8)
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=120)
    typer.echo(f"wrote {out}")


@app.command("from-service")
def from_service(
    eval_dir: Annotated[Path, typer.Option(help="The --out folder of a `bridge-rl eval --mode agent` run.")],
    url: Annotated[str, typer.Option(help="The policy service that answered (for its trajectories).")] = (
        "http://127.0.0.1:8000"
    ),
    out: Annotated[Path | None, typer.Option(help="Write the summary here (JSON).")] = None,
) -> None:
    """The same statistics from a `bridge-rl eval` run over the live services: each question's trajectory is read
    back from the policy service (GET /v1/trajectories/{id}) for its queries and text."""
    import httpx

    from services.common.answers import valid_search_r1_sequence
    from services.common.schemas.policy import TrajectoryRecord
    from services.eval.report import read_results

    results = [r for r in read_results(eval_dir / "results.jsonl") if r.mode == "agent"]
    rows = []
    with httpx.Client(base_url=url, timeout=30) as client:
        for r in results:
            response = client.get(f"/v1/trajectories/{r.trajectory_id}") if r.trajectory_id else None
            # a failed request logged no trajectory (404): it counts, as unanswered and without a search
            missing = response is None or response.status_code == 404
            record = None if missing else TrajectoryRecord.model_validate(response.raise_for_status().json())
            searches = [] if record is None else [t.search for t in record.turns if t.search is not None]
            answer = r.answer if record is not None else None
            rows.append(
                {
                    "dataset": r.dataset,
                    "id": r.id,
                    "answer": answer,
                    "answered": float(answer is not None),
                    "well_formed_search": float(bool(searches)),  # scaffold off: a search only follows one
                    "searches": len(searches),
                    "second_search": float(len(searches) >= 2),
                    "copies_question": float(
                        bool(searches) and searches[0].query.strip().lower() == r.question.strip().lower()
                    ),
                    "valid_format": float(record is not None and valid_search_r1_sequence(_with_observations(record))),
                    "recall": r.recall,
                    "em": r.em,
                    "f1": r.f1,
                    "queries": [s.query for s in searches],
                }
            )
    names = list(dict.fromkeys(r["dataset"] for r in rows))
    summary = {d: _stats([r for r in rows if r["dataset"] == d]) for d in names}
    keys = ("answered", "well_formed_search", "second_search", "copies_question", "valid_format", "em", "f1")
    summary["mean"] = {k: round(sum(summary[d][k] or 0 for d in names) / len(names), 4) for k in keys}
    for name, stats in summary.items():
        typer.echo(f"{name:16} {stats}")
    if out is not None:
        out.write_text(json.dumps({"eval_dir": str(eval_dir), "summary": summary, "rows": rows}, indent=1))


def _with_observations(record) -> str:
    """The trajectory text the em-format scorer reads, rebuilt without a tokenizer: each turn's text, then an
    <information> block where the turn searched (its contents do not change the format verdict)."""
    return "".join(
        t.text.replace("<|im_end|>", "") + ("\n\n<information>…</information>\n\n" if t.search else "")
        for t in record.turns
    )


if __name__ == "__main__":
    app()
