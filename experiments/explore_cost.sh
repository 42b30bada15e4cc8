#!/usr/bin/env bash
# What exploring served retrieval costs (issue 40, docs/results.md section 21): the same policy (the shipped warm
# start, on one vLLM engine) answers the evaluation split twice through POST /v1/agent/query, once from a policy
# service that retrieves greedy top-k and once from one where every query explores (serve_retrieval=sample,
# share 1, the default temperature and candidates). The default share's expected cost is its share of the
# per-query difference: each served query draws its kind independently.
#
#   bash experiments/explore_cost.sh [work dir, default .cache/explore] [datasets, default nq,hotpotqa,2wikimultihopqa]
#
# Needs ../shared/data (questions and corpora); the first 100 questions of each file are the evaluation split.
set -euo pipefail
WORK=$(realpath -m "${1:-.cache/explore}")
DATASETS=${2:-nq,hotpotqa,2wikimultihopqa}
SHARED=${BRIDGE_SHARED_DATA:-../shared/data}
BIN=${BIN:-.venv/bin}
mkdir -p "$WORK"
export BRIDGE_DATA_DIR="$WORK/home" BRIDGE_POLICY_MAX_NEW_TOKENS=64 BRIDGE_POLICY_VLLM_PORT=8111
export BRIDGE_POLICY_SERVE_RETRIEVAL=sample BRIDGE_POLICY_SERVE_RETRIEVAL_SHARE=1
"$BIN/bridge-rl" up --policy-port 8100 --retriever-port 8101 --console-port 8102 --no-demo-data > "$WORK/up.log" 2>&1 &
UP=$!
GREEDY=
trap 'kill $GREEDY 2>/dev/null; kill $UP; wait' EXIT
until grep -q "(or BRIDGE_ADMIN_TOKEN)" "$WORK/up.log"; do
  kill -0 $UP || { tail -30 "$WORK/up.log"; exit 1; }
  sleep 2
done
corpora=()
for name in ${DATASETS//,/ } wiki_sample; do corpora+=("$SHARED/corpus/$name.jsonl"); done
"$BIN/bridge-rl" ingest --url http://127.0.0.1:8101 "${corpora[@]}"
# The greedy arm: a second policy service on the same engine and model, retrieving greedy top-k.
BRIDGE_POLICY_SERVE_RETRIEVAL=greedy BRIDGE_POLICY_VLLM_URL=http://127.0.0.1:8111 \
  BRIDGE_POLICY_MODEL_DIR="$BRIDGE_DATA_DIR/models/SmolLM2-135M-Instruct-warmstart" \
  BRIDGE_POLICY_RETRIEVER_URL=http://127.0.0.1:8101 \
  "$BIN/bridge-rl" serve policy --port 8103 > "$WORK/greedy-policy.log" 2>&1 &
GREEDY=$!
until curl -sf http://127.0.0.1:8103/readyz > /dev/null; do kill -0 $GREEDY; sleep 2; done
curl -s http://127.0.0.1:8100/v1/serving; echo
curl -s http://127.0.0.1:8103/v1/serving; echo
for arm in greedy:8103 explore:8100; do
  start=$(date +%s)
  "$BIN/bridge-rl" eval --dataset "$DATASETS" --mode agent --limit 100 --qa-dir "$SHARED/qa" \
    --url "http://127.0.0.1:${arm#*:}" --retriever-url http://127.0.0.1:8101 --concurrency 32 --out "$WORK/${arm%%:*}"
  echo "${arm%%:*}: $(($(date +%s) - start)) s"
done
"$BIN/python" -m experiments.swap_em compare --before "$WORK/greedy" --after "$WORK/explore" --out "$WORK/compare"
cat "$WORK/compare.md"
