"""The `bridge-rl` Typer app and what its command groups share: one-line errors instead of tracebacks, the
`checkpoints` sub-app, JSON output."""

from __future__ import annotations

import json
import os
import sys
from typing import Annotated

import typer

DEBUG_ENV = "BRIDGE_DEBUG"


class _App(typer.Typer):
    """A service's refusal (or a service that cannot be reached, or a part of the stack that `up` cannot start) is
    one line on stderr and exit status 1, not a traceback; `bridge-rl --debug ...` (or BRIDGE_DEBUG=1) shows the
    traceback."""

    def __call__(self, *args, **kwargs):
        import httpx

        from services.cli.launcher import LaunchError
        from services.common.clients.base import ServiceError

        try:
            return super().__call__(*args, **kwargs)
        except (ServiceError, httpx.TransportError, LaunchError) as exc:
            if os.environ.get(DEBUG_ENV, "") not in ("", "0"):
                raise
            if isinstance(exc, LaunchError):
                message = str(exc)
            elif isinstance(exc, ServiceError):
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


def _echo_json(data: object) -> None:
    typer.echo(json.dumps(data, indent=2))
