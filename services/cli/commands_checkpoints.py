"""`bridge-rl checkpoints list | register | activate | rollback` against a running service (`--url`, `--token`)."""

from __future__ import annotations

from typing import Annotated

import typer

from services.cli.admin import RETRIEVER_URL, ServiceUrl, Token, admin_token
from services.cli.app import _echo_json, checkpoints_app


def _admin_client(url: str, token: str | None):
    from services.common.clients.retriever import RetrieverClient

    return RetrieverClient(url, admin_token=admin_token(token), timeout=600)


@checkpoints_app.command("list")
def checkpoints_list(url: ServiceUrl = RETRIEVER_URL, token: Token = None) -> None:
    """Show the active, previous and registered versions."""
    with _admin_client(url, token) as client:
        _echo_json(client.checkpoints().model_dump())


@checkpoints_app.command("register")
def checkpoints_register(
    path: Annotated[str, typer.Argument(help="Folder under the checkpoint root.")],
    url: ServiceUrl = RETRIEVER_URL,
    token: Token = None,
    strict_lineage: Annotated[
        bool, typer.Option(help="Refuse it when its parent version is not registered on this service.")
    ] = False,
) -> None:
    """Verify (sha256 of every file) and register a checkpoint folder. A parent version this service has never
    seen is kept as lineage metadata (the answer says so), unless --strict-lineage."""
    with _admin_client(url, token) as client:
        registered = client.register(path, strict_lineage=strict_lineage)
    _echo_json(registered.model_dump())
    for note in registered.notes:
        typer.echo(f"note: {note}", err=True)


@checkpoints_app.command("activate")
def checkpoints_activate(version: str, url: ServiceUrl = RETRIEVER_URL, token: Token = None) -> None:
    """Make a registered version serve new requests (in-flight ones finish on theirs)."""
    with _admin_client(url, token) as client:
        _echo_json(client.activate(version).model_dump())


@checkpoints_app.command("rollback")
def checkpoints_rollback(url: ServiceUrl = RETRIEVER_URL, token: Token = None) -> None:
    """Re-activate the previous version."""
    with _admin_client(url, token) as client:
        _echo_json(client.rollback().model_dump())
