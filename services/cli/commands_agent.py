"""`bridge-rl ask | eval`: questions to the running agent."""

from __future__ import annotations

from enum import StrEnum
from pathlib import Path
from typing import Annotated

import typer

from services.cli.admin import POLICY_URL, POLICY_URL_ENV, RETRIEVER_URL, RETRIEVER_URL_ENV, Token, admin_token
from services.cli.app import app
from services.common.schemas.retriever import DEFAULT_TOP_K, MAX_AGENT_TOP_K


class AgentModeName(StrEnum):
    direct = "direct"
    naive_rag = "naive-rag"
    agent = "agent"
    oracle = "oracle"
    oracle_search = "oracle-search"


@app.command()
def ask(
    question: Annotated[str, typer.Argument(help="The question to answer.")],
    url: Annotated[str, typer.Option(help="Policy service base URL.")] = "http://127.0.0.1:8000",
    max_turns: Annotated[int, typer.Option(min=0, max=8, help="Searches allowed before the final answer.")] = 4,
    top_k: Annotated[int, typer.Option(min=1, max=MAX_AGENT_TOP_K, help="Documents per search.")] = DEFAULT_TOP_K,
    mode: Annotated[
        AgentModeName, typer.Option(help="agent, naive-rag (one search, then the answer) or direct (no search).")
    ] = AgentModeName.agent,
    stream: Annotated[bool, typer.Option(help="Show each step as it happens (default); --no-stream: at the end.")] = (
        True
    ),
) -> None:
    """Ask the running agent a question; print its answer, searches and the documents it read."""
    from rich.console import Console

    if mode in (AgentModeName.oracle, AgentModeName.oracle_search):
        raise typer.BadParameter("oracle mode shows a question's supporting passages: use `bridge-rl eval`",
                                 param_hint="--mode")  # fmt: skip

    from services.common.clients.policy import PolicyClient

    console = Console(highlight=False)
    params = {"max_turns": max_turns, "top_k": top_k, "mode": mode.value}
    with PolicyClient(url) as client:
        if stream:
            response = _print_stream(console, client.query_stream(question, **params))
        else:
            response = client.query(question, **params)
            for i, turn in enumerate(response.turns):
                if turn.text.strip():
                    console.print(f"[bold]turn {i}[/bold] {turn.text.strip()}")
                if turn.search:
                    console.print(f"  [cyan]search[/cyan] {turn.search.query!r}")
                    for doc in turn.search.docs:
                        console.print(f"    - {doc['title']} ({doc['id']})")
    console.print(f"[bold green]answer[/bold green] {response.answer or '(none)'}")
    console.print(
        f"policy {response.policy_version} · retriever {response.retriever_version} · "
        f"trajectory {response.trajectory_id} · {response.timings.get('total_s', 0):.1f}s"
    )


def _print_stream(console, events):
    """Print a streamed answer as it comes: each turn's text, its search, the documents with their scores."""
    current_turn, response = None, None
    for event in events:
        if event.type == "delta":
            if event.turn != current_turn:
                current_turn = event.turn
                console.print(f"[bold]turn {event.turn}[/bold] ", end="")
            console.out(event.text, end="", highlight=False)
        elif event.type == "search":
            if current_turn is not None:
                console.print()
            current_turn = None
            console.print(f"  [cyan]search[/cyan] {event.query!r}")
        elif event.type == "documents":
            for doc in event.docs:
                console.print(f"    - {doc.title} ({doc.id}) score {doc.score:.3f}")
            console.print(f"    [dim]{event.mode}, retriever {event.retriever_version}[/dim]")
        elif event.type == "done":
            response = event.response
    if current_turn is not None:
        console.print()
    return response


@app.command("eval")
def evaluate(
    dataset: Annotated[
        str, typer.Option(help="A dataset, comma-separated datasets, a group (general, multi-hop, medical) or all.")
    ] = "all",
    limit: Annotated[int, typer.Option(min=1, help="The first N questions of each dataset (a fixed split).")] = 100,
    mode: Annotated[
        list[AgentModeName] | None,
        typer.Option(
            help="Repeatable. direct: no retrieval; naive-rag: one search with the question; agent; oracle: the "
            "agent shown the question's supporting passages (metadata.supporting_doc_ids) as its first "
            "<information> block, written as naive-rag's search, before its first turn; oracle-search: those "
            "passages answer the agent's own first search (an oracle retriever); both to set against agent "
            "(python -m experiments.headroom). Default: the first three."
        ),
    ] = None,
    policy: Annotated[str | None, typer.Option(help="Serve this policy version while evaluating.")] = None,
    retriever: Annotated[str | None, typer.Option(help="Serve this retriever version while evaluating.")] = None,
    url: Annotated[str, typer.Option(envvar=POLICY_URL_ENV, help="Policy service base URL.")] = POLICY_URL,
    retriever_url: Annotated[
        str, typer.Option(envvar=RETRIEVER_URL_ENV, help="Retriever base URL (for --retriever).")
    ] = RETRIEVER_URL,
    token: Token = None,
    qa_dir: Annotated[
        Path | None, typer.Option(help="Question files <dataset>.jsonl (default BRIDGE_TRAINER_QA_DIR).")
    ] = None,
    data: Annotated[
        Path | None,
        typer.Option(
            help="Your own questions instead of --qa-dir: a Search-R1/verl .parquet, a FlashRAG .jsonl (question, "
            "golden_answers), or a folder of them; --dataset picks among the datasets they hold (all by default), "
            "--limit takes the first N of each. Never one of our <dataset>_train.jsonl files. Bad rows are "
            "skipped, each named with its row number.",
        ),
    ] = None,
    out: Annotated[Path | None, typer.Option(help="Output folder (default <BRIDGE_DATA_DIR>/eval/<time>).")] = None,
    concurrency: Annotated[int, typer.Option(min=1, max=256, help="Questions in flight.")] = 16,
    max_turns: Annotated[int, typer.Option(min=0, max=8, help="Agent: searches before the final answer.")] = 4,
    top_k: Annotated[
        int, typer.Option(min=1, max=MAX_AGENT_TOP_K, help="Documents per search (the k of recall@k).")
    ] = DEFAULT_TOP_K,
    api_key: Annotated[str | None, typer.Option(envvar="BRIDGE_API_KEY", help="Agent API key, if required.")] = None,
    resume: Annotated[
        bool, typer.Option(help="Keep what <out>/results.jsonl already holds and ask only the rest (needs --out).")
    ] = False,
    samples: Annotated[
        int,
        typer.Option(
            min=0,
            max=64,
            help="Also K sampled agent answers per question (samples.jsonl, questions.jsonl): "
            "mean EM over samples next to greedy EM@1 (services/eval/sampled.py).",
        ),
    ] = 0,
    temperature: Annotated[float, typer.Option(min=0.01, max=5.0, help="--samples: decoding temperature.")] = 1.0,
    retrieval_temperature: Annotated[
        float, typer.Option(min=0.001, help="--samples: sampled retrieval's softmax(score / T), as rollouts.")
    ] = 0.05,
    seed: Annotated[int, typer.Option(min=0, help="--samples: the same seed draws the same samples.")] = 0,
) -> None:
    """Run the agent and its baselines over the live services; write results.jsonl, summary.json/.md."""
    import asyncio
    import time

    from services.common.clients.policy import PolicyClient
    from services.common.clients.retriever import RetrieverClient
    from services.common.schemas.policy import ORACLE_MODES
    from services.data.datasets import items_from_rows, load_items, resolve
    from services.data.files import DataFileError
    from services.data.split import SplitViolation, evaluation_data, refuse_trained_questions
    from services.eval.pinning import pinned
    from services.eval.report import read_results, write_report
    from services.eval.runner import MODES
    from services.eval.runner import evaluate as run_eval
    from services.modeling.shipped import load_shipped_manifest
    from services.trainer.settings import TrainerSettings

    settings = TrainerSettings()
    qa = qa_dir or settings.qa_dir
    if data is not None:
        try:
            rows = evaluation_data(data, qa)
        except DataFileError as exc:
            raise typer.BadParameter(str(exc), param_hint="--data") from exc
        for line in rows.report():
            typer.echo(line)
        try:
            items = items_from_rows(rows.rows, dataset, limit)
        except ValueError as exc:
            raise typer.BadParameter(str(exc), param_hint="--dataset") from exc
        datasets = list(items)
        if not datasets:
            raise typer.BadParameter(f"no questions of {dataset!r} in {data}", param_hint="--dataset")
    else:
        try:
            datasets = resolve(qa, dataset)
        except FileNotFoundError as exc:
            raise typer.BadParameter(str(exc), param_hint="--dataset") from exc
        if not datasets:
            raise typer.BadParameter(f"no question files for {dataset!r} in {qa}", param_hint="--dataset")
        items = {d: load_items(qa, d, limit) for d in datasets}
    modes = [m.value for m in mode] if mode else list(MODES)
    oracle_items = {d: [i for i in items[d] if i.supporting_doc_ids] for d in datasets}
    oracle_modes = [m for m in modes if m in ORACLE_MODES]
    if oracle_modes:  # only a question's supporting passages can be shown: the others are not asked
        no_passages = [d for d in datasets if not oracle_items[d]]
        partial = [f"{d} {len(oracle_items[d])}/{len(items[d])}" for d in datasets
                   if 0 < len(oracle_items[d]) < len(items[d])]  # fmt: skip
        if no_passages:
            typer.echo(f"oracle: skipping {', '.join(no_passages)} (no metadata.supporting_doc_ids in their questions)")
        if partial:
            typer.echo(f"oracle: only the questions with supporting passages: {', '.join(partial)}")
        if modes == oracle_modes and not any(oracle_items.values()):
            raise typer.BadParameter(f"no question of {datasets} names supporting passages", param_hint="--mode")
    try:  # the split: never score the default policy on questions its warm start trained on
        refuse_trained_questions([(i.dataset, i.id) for d in datasets for i in items[d]], load_shipped_manifest() or {})
    except SplitViolation as exc:
        raise typer.BadParameter(str(exc), param_hint="--limit/--dataset") from exc
    work = [(item, m) for d in datasets for m in modes for item in (oracle_items[d] if m in ORACLE_MODES else items[d])]
    if resume and out is None:
        raise typer.BadParameter("--resume needs the --out of the run to continue", param_hint="--resume")
    out = out or settings.data_dir / "eval" / time.strftime("%Y%m%d-%H%M%S")
    out.mkdir(parents=True, exist_ok=True)
    # Errored questions are asked again; answered ones are kept as they are.
    done = [r for r in read_results(out / "results.jsonl") if r.error is None] if resume else []
    finished = {(r.dataset, r.mode, r.id) for r in done}
    work = [(item, m) for item, m in work if (item.dataset, m, item.id) not in finished]
    meta = {"datasets": datasets, "modes": modes, "limit": limit, "max_turns": max_turns, "top_k": top_k,
            "qa_dir": str(qa), **({"data": str(data.resolve())} if data is not None else {})}  # fmt: skip
    sizes = ", ".join(f"{d} {len(items[d])}" for d in datasets)
    typer.echo(f"{len(work)} to ask, {len(done)} already done ({sizes}) x {modes} -> {out}")
    token = admin_token(token) if (policy or retriever) else None  # pinning a version is an admin call
    results_file = (out / "results.jsonl").open("w")  # rewritten whole: a torn last line must not stay
    results_file.writelines(r.model_dump_json() + "\n" for r in done)

    def keep(result) -> None:
        results_file.write(result.model_dump_json() + "\n")
        results_file.flush()

    with (
        RetrieverClient(retriever_url, admin_token=token, timeout=600) as ret_client,
        PolicyClient(url, admin_token=token) as pol_client,
        pinned([(ret_client, retriever), (pol_client, policy)]),
    ):
        headers = {"X-API-Key": api_key} if api_key else None
        results = asyncio.run(
            run_eval(
                url, work, concurrency=concurrency, max_turns=max_turns, top_k=top_k, headers=headers, on_result=keep
            )  # fmt: skip
        )
        results_file.close()
        if samples:
            from services.eval.sampled import write_sampled

            sampled = write_sampled(out, pol_client, [*done, *results], [i for d in datasets for i in items[d]],
                                    samples=samples, temperature=temperature,
                                    retrieval_temperature=retrieval_temperature, seed=seed, max_turns=max_turns,
                                    top_k=top_k)  # fmt: skip
            for scope, m in sampled.items():
                typer.echo(f"{scope:16} agent     n={m['n']:<4} em@1 (greedy) {m['em_greedy'] or 0:.3f} "
                           f"em over {samples} samples {m['em_sampled'] or 0:.3f}")  # fmt: skip
    rows = write_report(out, [*done, *results], meta, top_k)
    for r in rows:
        recall = "–" if r.recall is None else f"{r.recall:.3f}"
        typer.echo(f"{r.dataset:16} {r.mode:9} n={r.n:<4} em {r.em:.3f} f1 {r.f1:.3f} cover {r.cover:.3f} "
                   f"recall@{top_k} {recall} "
                   f"searches {r.searches:.2f} answered {r.answered:.2f} errors {r.errors}")  # fmt: skip
    typer.echo(f"summary: {out / 'summary.md'}")
    if any(r.errors for r in rows):
        raise typer.Exit(1)
