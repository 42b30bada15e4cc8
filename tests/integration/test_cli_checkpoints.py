"""Issue #15, the CLI as a person meets it: registering a retriever checkpoint from another deployment (its parent
unknown here) works and says so; --strict-lineage refuses it in one line on stderr, exit 1, no traceback;
--debug shows the traceback."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import httpx
import pytest

from services.common.checkpoints import publish_checkpoint, staging_dir
from tests.conftest import REPO

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def retriever(retriever_factory, models_root):
    from services.modeling.encoder import SentenceEncoder

    service = retriever_factory("cli-retriever")
    root = service.data_dir / "checkpoints"
    encoder = SentenceEncoder.from_pretrained(models_root / "all-MiniLM-L6-v2")
    staging = staging_dir(root, "imported-q")
    encoder.save_weights(staging / "query_encoder.safetensors")
    # Trained elsewhere: its parent is a version this deployment never had.
    publish_checkpoint(staging, root / "imported-q", kind="retriever-query", version="imported-q",
                       parent="other-deployment-r7-retriever")  # fmt: skip
    return service


def cli(service, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "BRIDGE_DATA_DIR": str(service.data_dir), "BRIDGE_ADMIN_TOKEN": service.token}
    env.pop("BRIDGE_DEBUG", None)
    return subprocess.run([sys.executable, "-m", "services.cli.main", *args], env=env, cwd=REPO,
                          capture_output=True, text=True, timeout=300)  # fmt: skip


def test_strict_lineage_refuses_in_one_line_and_debug_shows_the_traceback(retriever):
    refused = cli(retriever, "checkpoints", "register", "imported-q", "--url", retriever.url, "--strict-lineage")
    assert refused.returncode == 1 and refused.stdout == ""
    assert refused.stderr.strip() == (
        "bridge-rl: refused (400): parent version other-deployment-r7-retriever is not registered "
        "(strict lineage was asked)"
    )
    debug = cli(retriever, "--debug", "checkpoints", "register", "imported-q", "--url", retriever.url,
                "--strict-lineage")  # fmt: skip
    assert debug.returncode != 0 and "Traceback" in debug.stderr and "ServiceError" in debug.stderr
    unknown = cli(retriever, "checkpoints", "activate", "nope", "--url", retriever.url)
    assert unknown.returncode == 1 and unknown.stderr.count("\n") == 1 and "not registered" in unknown.stderr
    down = cli(retriever, "checkpoints", "list", "--url", "http://127.0.0.1:9")
    assert down.returncode == 1 and down.stderr.startswith("bridge-rl: cannot reach http://127.0.0.1:9")
    assert "Traceback" not in refused.stderr + unknown.stderr + down.stderr


def test_a_checkpoint_whose_parent_is_unknown_here_registers_and_serves(retriever):
    run = cli(retriever, "checkpoints", "register", "imported-q", "--url", retriever.url)
    assert run.returncode == 0, run.stderr
    answer = json.loads(run.stdout)
    assert answer["version"] == "imported-q" and answer["parent"] == "other-deployment-r7-retriever"
    assert answer["parent_known"] is False and "not registered here" in answer["notes"][0]
    assert run.stderr.startswith("note: parent version other-deployment-r7-retriever is not registered here")
    assert cli(retriever, "checkpoints", "activate", "imported-q", "--url", retriever.url).returncode == 0
    listing = httpx.get(retriever.url + "/v1/checkpoints").json()
    assert listing["active"] == "imported-q"
    assert {"version": "imported-q", "parent": "other-deployment-r7-retriever"}.items() <= next(
        c for c in listing["checkpoints"] if c["version"] == "imported-q"
    ).items()
    search = httpx.post(retriever.url + "/v1/search", json={"queries": ["film"], "top_k": 1})
    assert search.status_code == 200 and search.json()["retriever_version"] == "imported-q"
