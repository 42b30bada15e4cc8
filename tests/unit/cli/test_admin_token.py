"""The CLI's admin commands are clients: they take `--url` and `--token` (or BRIDGE_ADMIN_TOKEN), read the token
file only when it is there, and never create one (on another host a fresh file only led to a 403). Only a server
generates the token."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.conftest import REPO

ADMIN_COMMANDS = [
    ["checkpoints", "list"],
    ["checkpoints", "register", "some-folder"],
    ["checkpoints", "activate", "v1"],
    ["checkpoints", "rollback"],
    ["ingest", "{corpus}"],
]


@pytest.fixture
def service(refusing_admin_server):
    return refusing_admin_server


def cli(home, args, corpus, **env_extra):
    env = {k: v for k, v in os.environ.items() if not k.startswith("BRIDGE_")}
    env.update(BRIDGE_DATA_DIR=str(home), **env_extra)
    args = [a.replace("{corpus}", str(corpus)) for a in args]
    return subprocess.run([sys.executable, "-m", "services.cli.main", *args], env=env, cwd=REPO,
                          capture_output=True, text=True, timeout=120)  # fmt: skip


@pytest.fixture
def corpus(tmp_path):
    path = tmp_path / "corpus.jsonl"
    path.write_text(json.dumps({"id": "0", "title": "t", "text": "x"}) + "\n")
    return path


@pytest.mark.parametrize("args", ADMIN_COMMANDS, ids=" ".join)
def test_without_a_token_the_client_says_so_and_writes_no_token_file(tmp_path, corpus, service, args):
    url, seen = service
    home = tmp_path / "home"
    run = cli(home, [*args, "--url", url], corpus)
    assert run.returncode == 1 and "Traceback" not in run.stderr
    assert "no admin token" in run.stderr and "--token" in run.stderr and "BRIDGE_ADMIN_TOKEN" in run.stderr
    assert not (home / "admin_token").exists() and seen == []


@pytest.mark.parametrize("args", ADMIN_COMMANDS, ids=" ".join)
def test_the_token_and_url_come_from_options_or_the_environment(tmp_path, corpus, service, args):
    url, seen = service
    home = tmp_path / "home"
    by_option = cli(home, [*args, "--url", url, "--token", "given"], corpus)
    by_env = cli(home, args, corpus, BRIDGE_ADMIN_TOKEN="from-env", BRIDGE_RETRIEVER_URL=url)
    for run in (by_option, by_env):
        last_line = run.stderr.strip().splitlines()[-1]  # (ingest draws its progress bar first)
        assert run.returncode == 1 and last_line == "bridge-rl: refused (403): bad token", run.stderr
    assert seen == ["Bearer given", "Bearer from-env"]
    assert not (home / "admin_token").exists()


def test_the_token_file_of_a_local_server_is_still_used(tmp_path, corpus, service):
    url, seen = service
    home = tmp_path / "home"
    home.mkdir()
    (home / "admin_token").write_text("local-server-token\n")
    run = cli(home, ["checkpoints", "list", "--url", url], corpus)
    assert run.returncode == 1 and seen == ["Bearer local-server-token"]


def test_eval_pinning_a_version_needs_a_token_and_writes_no_file(tmp_path, corpus, service):
    url, seen = service
    home, qa = tmp_path / "home", tmp_path / "qa"
    qa.mkdir()
    (qa / "toy.jsonl").write_text(json.dumps({"id": "t1", "question": "q?", "golden_answers": ["a"]}) + "\n")
    run = cli(home, ["eval", "--dataset", "toy", "--limit", "1", "--retriever", "v1", "--retriever-url", url,
                     "--url", url, "--qa-dir", str(qa), "--out", str(tmp_path / "out")], corpus)  # fmt: skip
    assert run.returncode == 1 and "no admin token" in run.stderr, run.stderr
    assert not (home / "admin_token").exists() and seen == []
