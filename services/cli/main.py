"""`bridge-rl`: the one command-line entry point (plain `bridge` is iproute2's tool on Linux). The commands
live in one module per group; importing them registers them on `app`."""

from __future__ import annotations

from services.cli import commands_agent, commands_checkpoints, commands_services, commands_train  # noqa: F401
from services.cli.app import app

if __name__ == "__main__":
    app()
