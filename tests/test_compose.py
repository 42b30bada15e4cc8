"""docker-compose.yml is valid for both profiles (Debian's docker-compose validates without an engine)."""

import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
COMPOSE = shutil.which("docker-compose")


@pytest.mark.skipif(COMPOSE is None, reason="docker-compose is not installed (.ci/run installs Debian's)")
@pytest.mark.parametrize("profile", ["cpu", "gpu"])
def test_compose_config_is_valid(profile):
    cmd = [COMPOSE, "--env-file", str(REPO / ".env.example"), "--profile", profile]
    result = subprocess.run([*cmd, "config", "-q"], cwd=REPO, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    services = subprocess.run([*cmd, "config", "--services"], cwd=REPO, capture_output=True, text=True, check=True)
    expected = {"base", "models", "qdrant", "redis", "retriever", "policy", "vllm", "policy-gpu", "worker", "console"}
    assert set(services.stdout.split()) == expected


def test_compose_refuses_a_missing_admin_token(tmp_path):
    if COMPOSE is None:
        pytest.skip("docker-compose is not installed")
    empty = tmp_path / "empty.env"
    empty.write_text("")
    result = subprocess.run([COMPOSE, "--env-file", str(empty), "--profile", "cpu", "config", "-q"], cwd=REPO,
                            capture_output=True, text=True)  # fmt: skip
    assert result.returncode != 0 and "BRIDGE_ADMIN_TOKEN" in result.stderr
