"""What the CLI's admin commands share: `--url` and `--token` (with their variables), and the token a client uses.

A client never creates a token: it takes `--token` / BRIDGE_ADMIN_TOKEN, else the file that a server on this
host keeps in `<BRIDGE_DATA_DIR>/admin_token`, else it stops with a one-line error (a token made up here would
only be refused, 403, by a server on another host). Servers generate theirs (`CommonSettings.resolve_admin_token`).
"""

from __future__ import annotations

from typing import Annotated

import typer

TOKEN_ENV = "BRIDGE_ADMIN_TOKEN"
RETRIEVER_URL_ENV = "BRIDGE_RETRIEVER_URL"
POLICY_URL_ENV = "BRIDGE_POLICY_URL"
RETRIEVER_URL = "http://127.0.0.1:8001"
POLICY_URL = "http://127.0.0.1:8000"

RetrieverUrl = Annotated[str, typer.Option("--url", envvar=RETRIEVER_URL_ENV, help="Retriever base URL.")]
ServiceUrl = Annotated[
    str, typer.Option("--url", envvar=RETRIEVER_URL_ENV, help="Service base URL (the retriever, or the policy).")
]
Token = Annotated[
    str | None,
    typer.Option(
        "--token",
        envvar=TOKEN_ENV,
        help="The service's admin token. Default: the one a server on this host keeps in <data dir>/admin_token.",
    ),
]


def admin_token(token: str | None) -> str:
    """`--token` (or BRIDGE_ADMIN_TOKEN), else this host's stored token; else a one-line error, exit status 1."""
    if token:
        return token
    from services.common.settings import CommonSettings

    settings = CommonSettings()
    stored = settings.stored_admin_token()
    if stored:
        return stored
    typer.echo(
        f"bridge-rl: no admin token: pass --token or set {TOKEN_ENV} (a server on this host keeps its own in "
        f"{settings.admin_token_file}; none is there)",
        err=True,
    )
    raise typer.Exit(1)
