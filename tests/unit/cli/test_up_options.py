"""`bridge-rl up`'s options reach the processes it starts (--host, --workers, --no-demo-data), and a line of
progress comes every 15 s while a service starts (vLLM: the phase from its log). Nothing is started here."""

from __future__ import annotations

import os
import signal

import pytest
from typer.testing import CliRunner

from services.cli.launcher import Progress, Stack, client_host, vllm_phase
from services.common.settings import CommonSettings


def option(args: list[str], name: str) -> str:
    return args[args.index(name) + 1]


def test_commands_bind_the_host_and_run_the_workers(tmp_path):
    stack = Stack(CommonSettings(data_dir=tmp_path), host="0.0.0.0", workers=3, policy_port=18000)
    commands = stack.commands()
    assert list(commands) == ["retriever", "policy", "worker", "console"]  # start order
    for name in ("retriever", "policy", "console"):
        assert option(commands[name], "--host") == "0.0.0.0"
    assert option(commands["policy"], "--port") == "18000"
    assert option(commands["worker"], "--concurrency") == "3"
    assert stack.policy_url == "http://127.0.0.1:18000"  # clients on this host go through loopback
    assert Stack(CommonSettings(data_dir=tmp_path)).commands()["worker"][-1] == "1"


def test_each_child_gets_only_the_secrets_it_needs(tmp_path):
    stack = Stack(CommonSettings(data_dir=tmp_path, admin_token="t" * 32))
    stack.redis_url = "redis://127.0.0.1:6379/0"
    for name in ("retriever", "policy", "worker"):
        assert stack.child_env(name)["BRIDGE_ADMIN_TOKEN"] == "t" * 32
    assert "BRIDGE_ADMIN_TOKEN" not in stack.child_env("console")  # it holds no secret; the browser brings it


def test_client_host():
    assert client_host("0.0.0.0") == client_host("::") == "127.0.0.1"
    assert client_host("10.1.2.3") == "10.1.2.3"
    assert client_host("fe80::1") == "[fe80::1]"


def test_progress_reports_every_15_s_on_a_fake_clock():
    now = [100.0]
    lines: list[str] = []
    progress = Progress(lambda elapsed: f"waiting ... {elapsed:.0f} s", lines.append, clock=lambda: now[0])
    for t in (0, 5, 14.9, 15, 15.5, 29, 31, 76, 77):
        now[0] = 100.0 + t
        progress.tick()
    assert lines == ["waiting ... 15 s", "waiting ... 31 s", "waiting ... 76 s"]


def test_vllm_phase_from_its_log():
    assert vllm_phase("") == "starting"
    log = "INFO Starting to load model /m...\nINFO Loading weights took 0.5 seconds\n"
    assert vllm_phase(log) == "model loaded"
    assert vllm_phase(log + "INFO Dynamo bytecode transform time: 3.1 s\n").startswith("compiling")


def test_policy_wait_describes_this_starts_vllm_log(tmp_path, monkeypatch):
    monkeypatch.delenv("BRIDGE_POLICY_ENGINE", raising=False)
    stack = Stack(CommonSettings(data_dir=tmp_path))
    stack.logs.mkdir(parents=True)
    (stack.logs / "vllm.log").write_text("INFO Loading weights took 0.5 seconds\n")  # a previous start
    describe = stack.describe_wait("policy")
    assert describe(45).startswith("waiting for vLLM (starting) ... 45 s")
    with (stack.logs / "vllm.log").open("a") as fh:
        fh.write("INFO Dynamo bytecode transform time: 3.1 s\n")
    assert describe(60).startswith("waiting for vLLM (compiling")
    assert "transformers" not in describe(60)
    assert (
        Stack(CommonSettings(data_dir=tmp_path), engine="transformers")
        .describe_wait("policy")(15)
        .startswith("waiting for the policy (loading the model) ... 15 s")
    )


@pytest.fixture
def sigterm_restored():
    handler = signal.getsignal(signal.SIGTERM)
    yield
    signal.signal(signal.SIGTERM, handler)


@pytest.mark.parametrize("demo_flag, loaded", [([], True), (["--no-demo-data"], False)])
def test_up_passes_its_options_to_the_stack(tmp_path, monkeypatch, sigterm_restored, demo_flag, loaded):
    import services.cli.commands_services as commands
    import services.cli.demo as demo
    from services.cli.main import app

    made: list[Stack] = []
    ingested: list[Stack] = []

    class NotStarted(Stack):
        def __enter__(self) -> Stack:
            os.kill(os.getpid(), signal.SIGTERM)  # `up` waits for Ctrl-C / SIGTERM: send it at once
            return self

        def __exit__(self, *exc: object) -> None:
            pass

    def stack(policy_port, retriever_port, engine, console_port, host, workers, retriever_replicas):
        made.append(NotStarted(CommonSettings(data_dir=tmp_path), policy_port=policy_port,
                               retriever_port=retriever_port, engine=engine, console_port=console_port, host=host,
                               workers=workers, retriever_replicas=retriever_replicas))  # fmt: skip
        return made[-1]

    monkeypatch.setattr(commands, "_stack", stack)
    monkeypatch.setattr(demo, "ensure_demo_corpus", ingested.append)
    result = CliRunner().invoke(app, ["up", "--host", "0.0.0.0", "--workers", "2", "--retriever-replicas", "3",
                                      *demo_flag])  # fmt: skip
    assert result.exit_code == 0, result.output + repr(result.exception)
    assert (made[0].host, made[0].workers, made[0].retriever_replicas) == ("0.0.0.0", 2, 3)
    assert "3 replicas behind HAProxy" in result.output
    assert ingested == (made if loaded else [])
    assert "http://127.0.0.1:8000" in result.output


def test_replicas_without_haproxy_are_a_one_line_launch_error(tmp_path, monkeypatch):
    from services.cli import balancer
    from services.cli.launcher import LaunchError

    def missing() -> str:
        raise FileNotFoundError("haproxy is not installed (Debian: apt-get install haproxy)")

    monkeypatch.setattr(balancer, "haproxy_binary", missing)
    stack = Stack(CommonSettings(data_dir=tmp_path), retriever_replicas=2)
    with pytest.raises(LaunchError, match="--retriever-replicas 2 puts HAProxy in front: haproxy is not installed"):
        stack.start_retriever()
    assert stack.processes == []  # nothing started before the check


def test_balance_refuses_a_service_without_its_port_and_writes_a_checked_config(tmp_path, monkeypatch):
    from services.cli.main import app

    result = CliRunner().invoke(app, ["balance", "retriever", "--config-dir", str(tmp_path)])
    assert result.exit_code == 2 and "is not NAME:PORT" in result.output
    executed: list[list[str]] = []
    monkeypatch.setattr(os, "execv", lambda path, argv: executed.append(argv))
    monkeypatch.setattr("services.cli.balancer.haproxy_binary", lambda: "/bin/true")  # `-c` of a config: exit 0
    result = CliRunner().invoke(app, ["balance", "retriever:8001", "--port", "9001", "--config-dir", str(tmp_path)])
    assert result.exit_code == 0, result.output
    assert executed == [["/bin/true", "-db", "-f", str(tmp_path / "haproxy.cfg")]]
    config = (tmp_path / "haproxy.cfg").read_text()
    assert "bind 0.0.0.0:9001" in config and "server-template r 1-16 retriever:8001" in config


def test_the_demo_results_read_well_in_80_columns():
    """A CI log or `make demo > demo.log` is 80 columns: the old six-column table wrapped to a word a line there."""
    import io

    from rich.console import Console

    from services.cli.demo import result_tables

    question = {"question": "Which magazine was started first, Arthur's Magazine or First for Women?",
                "golden_answers": ["Arthur's Magazine"]}  # fmt: skip
    before = {"searched": ["Arthur's Magazine First for Women founded"], "answer": "First for Women"}
    after = {"searched": ["Arthur's Magazine first published"], "answer": "Arthur's Magazine"}
    out = io.StringIO()
    console = Console(file=out, width=80, force_terminal=False)
    for table in result_tables([question], [before], [after]):
        console.print(table)
    text = out.getvalue()
    assert "First for Women" in text and "Arthur's Magazine first published" in text  # no phrase broken up
    assert len(text.splitlines()) <= 12 and max(map(len, text.splitlines())) <= 80
