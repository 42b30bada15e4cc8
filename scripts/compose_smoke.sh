#!/usr/bin/env bash
# docker compose, for real: builds the images, starts the CPU profile with two retriever replicas behind the balancer
# (`--scale retriever=2`; BRIDGE_SMOKE_RETRIEVERS=N for another count), ingests the demo corpus, asks a question over
# REST, runs one training round on the worker service, sees both services hot-swap to the new versions (every
# retriever replica, asked directly, on the new one, holding every document), rolls both back (every replica back),
# and shuts everything down. Exit 0 only when every step held. No argument: `bash scripts/compose_smoke.sh`.
#
# - Installs docker.io, docker-compose and debootstrap (apt-get) when missing, and starts a Docker engine (niced)
#   when none answers; it stops what it started (trap), including the stack (`docker-compose down -v`).
# - Base image: BRIDGE_BASE_IMAGE, else the public python:3.11-slim-bookworm (present or pulled), else a Debian
#   bookworm built here with `debootstrap --variant=minbase` + `docker import` (kept as bridge-debian:bookworm).
# - Redis and Qdrant: their pinned images, else (no registry) Debian's redis-server on our base image and the
#   retriever's embedded Qdrant (docker/compose.offline.yml). It says which.
# - torch: PyTorch's CPU index where reachable, else the torch-2.13.0+cpu wheel that the host's pip configuration
#   gives (copied into docker/wheels/ for the build); the host's extra CA certificates go into docker/ca-certificates/.
#   Both copies are removed at the end.
# - Everything heavy runs at the lowest priority (nice/ionice, `docker build --cpu-shares 2`, cpu_shares: 2 on every
#   container). On failure: the containers' states and logs. Timeouts: BRIDGE_SMOKE_UP_TIMEOUT (s, default 3600) for
#   the stack to come up (vLLM-CPU compiles for minutes; a progress line every 30 s), BRIDGE_SMOKE_TRAIN_TIMEOUT
#   (default 2400) for the training round. BRIDGE_SMOKE_KEEP_IMAGES=0 removes the images it built at the end.
set -euo pipefail
cd "$(dirname "$0")/.."
T0=$(date +%s)
log() { printf '[smoke %5ss] %s\n' "$(($(date +%s) - T0))" "$*"; }
die() { log "FAILED: $*"; exit 1; }
LOW=(nice -n 19 ionice -c3)
UP_TIMEOUT=${BRIDGE_SMOKE_UP_TIMEOUT:-3600}
TRAIN_TIMEOUT=${BRIDGE_SMOKE_TRAIN_TIMEOUT:-2400}
RETRIEVERS=${BRIDGE_SMOKE_RETRIEVERS:-2}
PROJECT=bridge-smoke
WORK=$(mktemp -d /var/tmp/bridge-smoke.XXXXXX)
DOCKERD_PID=""
STACK=0
STEP="start"
COPIED=()
BUILT=()
OFFLINE=0

cleanup() {
  local rc=$?
  set +e
  trap - EXIT INT TERM
  if [ "$STACK" = 1 ]; then
    if [ "$rc" != 0 ]; then
      log "step '$STEP' failed: container states and logs follow"
      compose ps
      compose logs --no-color --tail=60
      local policy
      policy=$(compose ps -q policy 2>/dev/null)
      if [ -n "$policy" ]; then
        echo "--- policy: /data/logs/vllm.log (last 40 lines)"
        docker exec "$policy" tail -n 40 /data/logs/vllm.log 2>/dev/null
      fi
    fi
    log "docker-compose down -v"
    compose down -v --remove-orphans >"$WORK/down.log" 2>&1 || cat "$WORK/down.log"
  fi
  for pid in ${UP_PID:-} ${TRAIN_PID:-}; do kill -0 "$pid" 2>/dev/null && { kill "$pid"; wait "$pid" 2>/dev/null; }; done
  for f in "${COPIED[@]}"; do rm -f "$f"; done
  if [ "${BRIDGE_SMOKE_KEEP_IMAGES:-1}" = 0 ] && [ "${#BUILT[@]}" -gt 0 ]; then docker image rm "${BUILT[@]}" >/dev/null; fi
  if [ -n "$DOCKERD_PID" ]; then
    log "stopping the Docker engine this script started (pid $DOCKERD_PID)"
    kill "$DOCKERD_PID"; wait "$DOCKERD_PID" 2>/dev/null
  fi
  rm -rf "$WORK"
  if [ "$rc" = 0 ]; then log "PASSED: every step held ($(($(date +%s) - T0)) s)"; else log "FAILED at step '$STEP' (exit $rc)"; fi
  exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

compose() {
  local files=(-f docker-compose.yml)
  [ "$OFFLINE" = 1 ] && files+=(-f docker/compose.offline.yml)
  "${LOW[@]}" docker-compose -p "$PROJECT" --env-file "$WORK/smoke.env" "${files[@]}" -f "$WORK/compose.smoke.yml" \
    --profile cpu "$@"
}

# ---- tools and engine
STEP="tools"
missing=()
command -v docker >/dev/null || missing+=(docker.io)
command -v dockerd >/dev/null || missing+=(docker.io)
command -v docker-compose >/dev/null || missing+=(docker-compose)
command -v debootstrap >/dev/null || missing+=(debootstrap)
if [ "${#missing[@]}" -gt 0 ]; then
  log "installing ${missing[*]} (apt-get)"
  "${LOW[@]}" apt-get update -q >"$WORK/apt.log" 2>&1 || { cat "$WORK/apt.log"; die "apt-get update"; }
  DEBIAN_FRONTEND=noninteractive "${LOW[@]}" apt-get install -y -q "${missing[@]}" >>"$WORK/apt.log" 2>&1 \
    || { tail -20 "$WORK/apt.log"; die "apt-get install ${missing[*]}"; }
fi
if ! docker info >/dev/null 2>&1; then
  log "no Docker engine answers: starting dockerd (nice 19; stopped at the end)"
  "${LOW[@]}" dockerd >"$WORK/dockerd.log" 2>&1 &
  DOCKERD_PID=$!
  for _ in $(seq 60); do docker info >/dev/null 2>&1 && break; sleep 1; done
  docker info >/dev/null 2>&1 || { tail -20 "$WORK/dockerd.log"; die "dockerd did not start"; }
fi
log "docker engine $(docker version --format '{{.Server.Version}}'), $(docker-compose version --short 2>/dev/null || docker-compose version | head -1)"
df -h / | awk 'NR==2 {print "[smoke] disk: " $4 " free on /"}'

# ---- base image
STEP="base image"
pull() { timeout 90 docker pull -q "$1" >/dev/null 2>&1; }
have() { docker image inspect "$1" >/dev/null 2>&1; }
PUBLIC_BASE=python:3.11-slim-bookworm
if [ -n "${BRIDGE_BASE_IMAGE:-}" ]; then
  BASE_IMAGE=$BRIDGE_BASE_IMAGE; log "base image: $BASE_IMAGE (BRIDGE_BASE_IMAGE)"
elif have "$PUBLIC_BASE" || pull "$PUBLIC_BASE"; then
  BASE_IMAGE=$PUBLIC_BASE; log "base image: $BASE_IMAGE"
elif have bridge-debian:bookworm; then
  BASE_IMAGE=bridge-debian:bookworm
  log "base image: no registry answers ($PUBLIC_BASE cannot be pulled); bridge-debian:bookworm (a debootstrap of an earlier run)"
else
  BASE_IMAGE=bridge-debian:bookworm
  log "base image: no registry answers ($PUBLIC_BASE cannot be pulled): building $BASE_IMAGE with debootstrap --variant=minbase bookworm"
  mirror=${BRIDGE_DEBIAN_MIRROR:-http://deb.debian.org/debian}
  "${LOW[@]}" debootstrap --variant=minbase bookworm "$WORK/rootfs" "$mirror" >"$WORK/debootstrap.log" 2>&1 \
    || { tail -20 "$WORK/debootstrap.log"; die "debootstrap"; }
  rm -f "$WORK"/rootfs/var/cache/apt/archives/*.deb
  "${LOW[@]}" tar -C "$WORK/rootfs" -c . | docker import -c 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
    -c 'CMD ["bash"]' - "$BASE_IMAGE" >/dev/null
  rm -rf "$WORK/rootfs"
  log "base image: $BASE_IMAGE imported ($(docker image inspect -f '{{.Size}}' "$BASE_IMAGE" | awk '{printf "%.0f MB", $1/1e6}'))"
fi
if { have redis:7.0.15-alpine || pull redis:7.0.15-alpine; } && { have qdrant/qdrant:v1.20.0 || pull qdrant/qdrant:v1.20.0; }; then
  log "redis and qdrant: their pinned images"
else
  OFFLINE=1
  log "redis and qdrant: their images cannot be pulled; Debian's redis-server package on our base image, and the retriever's embedded Qdrant backend (docker/compose.offline.yml)"
fi

# ---- what the build needs from this host: CA certificates, the CPU torch wheel
STEP="build inputs"
for crt in /usr/local/share/ca-certificates/*.crt; do
  [ -f "$crt" ] || continue
  dest=docker/ca-certificates/$(basename "$crt")
  if [ ! -e "$dest" ]; then cp "$crt" "$dest"; COPIED+=("$dest"); log "CA certificate for the build: $crt"; fi
done
TORCH_INDEX=${BRIDGE_TORCH_INDEX:-https://download.pytorch.org/whl/cpu}
if ls docker/wheels/torch-2.13.0+cpu-*.whl >/dev/null 2>&1; then
  log "torch: $(ls docker/wheels/torch-2.13.0+cpu-*.whl) (already there)"
elif timeout 15 curl -fsS -o /dev/null "${TORCH_INDEX%/}/torch/" 2>/dev/null; then
  log "torch: 2.13.0 CPU build from $TORCH_INDEX"
else
  log "torch: $TORCH_INDEX not reachable; the torch-2.13.0+cpu wheel from this host's pip configuration"
  "${LOW[@]}" python3 -m pip download -q --no-deps --only-binary :all: -d "$WORK/wheels" "torch==2.13.0+cpu" \
    >"$WORK/pip.log" 2>&1 || { tail -5 "$WORK/pip.log"; die "no torch-2.13.0+cpu wheel (pip config list: find-links, index)"; }
  for whl in "$WORK"/wheels/torch-2.13.0+cpu-*.whl; do
    mv "$whl" docker/wheels/; COPIED+=("docker/wheels/$(basename "$whl")"); log "torch: $(basename "$whl")"
  done
fi

# ---- build, one image at a time, at the lowest priority
build() {  # tag dockerfile [build args...]
  local tag=$1 file=$2 t=$SECONDS
  shift 2
  STEP="build $tag"
  log "building $tag ($file)"
  { DOCKER_BUILDKIT=0 "${LOW[@]}" docker build --cpu-shares 2 -f "$file" -t "$tag" "$@" . 2>&1; echo "build-exit=$?"; } \
    | tee "$WORK/build-$tag.log" | grep --line-buffered -E '^Step [0-9]+/|^(base|policy): ' | sed -u -E "s/^(.{100}).+/\1 .../; s/^/  [$tag] /" \
    || true
  tail -1 "$WORK/build-$tag.log" | grep -qx "build-exit=0" || { tail -30 "$WORK/build-$tag.log"; die "docker build $tag"; }
  BUILT+=("$tag")
  log "built $tag in $((SECONDS - t)) s ($(docker image inspect -f '{{.Size}}' "$tag" | awk '{printf "%.2f GB", $1/1e9}'))"
}
build bridge-base docker/base.Dockerfile --build-arg "BASE_IMAGE=$BASE_IMAGE" --build-arg "TORCH_INDEX=$TORCH_INDEX"
build bridge-retriever docker/retriever.Dockerfile
build bridge-balancer docker/balancer.Dockerfile
build bridge-trainer docker/trainer.Dockerfile
build bridge-policy docker/policy.Dockerfile
[ "$OFFLINE" = 1 ] && build bridge-redis docker/redis.Dockerfile

# ---- the stack: CPU profile, a fresh admin token (a compose secret), free ports on 127.0.0.1
STEP="configure"
umask_old=$(umask); umask 077
python3 -c 'import secrets; print(secrets.token_urlsafe(32))' >"$WORK/admin_token"
python3 -c 'import secrets; print(secrets.token_urlsafe(32))' >"$WORK/redis_password"
umask "$umask_old"
TOKEN=$(cat "$WORK/admin_token")
read -r RPORT PPORT CPORT < <(python3 -c 'import socket
socks = [socket.socket() for _ in range(3)]
for s in socks: s.bind(("127.0.0.1", 0))
print(*(s.getsockname()[1] for s in socks))')
cat >"$WORK/smoke.env" <<EOF
BRIDGE_ENVIRONMENT=production
BRIDGE_ADMIN_TOKEN_FILE=$WORK/admin_token
BRIDGE_REDIS_PASSWORD_FILE=$WORK/redis_password
BRIDGE_RETRIEVER_PORT=$RPORT
BRIDGE_POLICY_PORT=$PPORT
BRIDGE_CONSOLE_PORT=$CPORT
BRIDGE_BASE_IMAGE=$BASE_IMAGE
EOF
{ echo "services:"; for s in base models qdrant redis retriever retriever-lb policy worker console; do echo "  $s: {cpu_shares: 2}"; done; } \
  >"$WORK/compose.smoke.yml"
compose config -q || die "docker-compose config"
STACK=1
STEP="up"
log "docker-compose --profile cpu up -d --scale retriever=$RETRIEVERS (models, redis, qdrant, $RETRIEVERS retrievers behind retriever-lb, policy with vLLM-CPU, worker, console)"
compose up -d --no-build --scale "retriever=$RETRIEVERS" >"$WORK/up.log" 2>&1 &
UP_PID=$!
deadline=$((SECONDS + UP_TIMEOUT))
while kill -0 "$UP_PID" 2>/dev/null; do
  [ "$SECONDS" -lt "$deadline" ] || die "the stack was not up after ${UP_TIMEOUT}s"
  sleep 30
  states=$(docker ps -a --filter "label=com.docker.compose.project=$PROJECT" \
    --format '{{.Label "com.docker.compose.service"}}={{.Status}}' | sed -E 's/ \(([a-z: ]+)\)/:\1/; s/Up [^:]*/up/; s/Exited \(([0-9]+)\).*/exited \1/' \
    | sort | paste -sd' ' -)
  policy=$(docker ps -q --filter "label=com.docker.compose.project=$PROJECT" --filter "label=com.docker.compose.service=policy")
  vllm=""
  [ -z "$policy" ] || vllm=$(docker exec "$policy" tail -n 1 /data/logs/vllm.log 2>/dev/null | cut -c1-110) || true
  log "up: $states${vllm:+ | vllm: $vllm}"
done
wait "$UP_PID" || { cat "$WORK/up.log"; die "docker-compose up"; }
UP_PID=""
log "stack up: $(docker ps --filter "label=com.docker.compose.project=$PROJECT" --format '{{.Label "com.docker.compose.service"}}:{{.Status}}' | sort | paste -sd' ' -)"
if [ "$OFFLINE" = 1 ]; then
  log "qdrant service: $(compose logs --no-color --no-log-prefix qdrant 2>/dev/null | tail -1)"
  log "redis service: $(compose exec -T redis redis-server --version | cut -d' ' -f1-3) (Debian's package)"
fi
STEP="worker healthy"
worker=$(docker ps -q --filter "label=com.docker.compose.project=$PROJECT" --filter "label=com.docker.compose.service=worker")
[ -n "$worker" ] || die "the worker is not running"
for _ in $(seq 60); do
  [ "$(docker inspect -f '{{.State.Health.Status}}' "$worker")" = healthy ] && break
  sleep 5
done
[ "$(docker inspect -f '{{.State.Health.Status}}' "$worker")" = healthy ] || die "the worker is not healthy"
log "worker healthy; nothing secret in any container's environment: $(docker inspect -f '{{range .Config.Env}}{{println .}}{{end}}' \
  $(docker ps -q --filter "label=com.docker.compose.project=$PROJECT") | grep -c '^BRIDGE_ADMIN_TOKEN=') BRIDGE_ADMIN_TOKEN entries"

R=http://127.0.0.1:$RPORT
P=http://127.0.0.1:$PPORT
api() { curl -fsS -m "${TIMEOUT:-60}" "$@"; }
active() { api "$1/v1/checkpoints" | python3 -c 'import json, sys; print(json.load(sys.stdin)["active"])'; }
# each retriever replica's /readyz, asked inside its container (not through the balancer): "<version> <documents>"
replicas() {
  local ids
  ids=$(docker ps -q --filter "label=com.docker.compose.project=$PROJECT" --filter "label=com.docker.compose.service=retriever")
  for c in $ids; do
    docker exec "$c" python -c 'import json, urllib.request
r = json.load(urllib.request.urlopen("http://127.0.0.1:8001/readyz", timeout=30)); print(r["retriever_version"], r["documents"])'
  done
}
# every replica on version $1 with the same, non-zero document count, and as many replicas as asked for
replicas_on() {
  local seen
  for _ in $(seq 30); do  # a replica flips within the group's lag bound (30 s)
    seen=$(replicas | sort | uniq -c | awk '{print $2 "x" $1 ":" $3}' | paste -sd' ' -)
    [ "$seen" = "${1}x${RETRIEVERS}:$2" ] && { echo "  replicas: $seen"; return 0; }
    sleep 2
  done
  echo "  replicas: $seen (expected ${1}x${RETRIEVERS}:$2)"; return 1
}

STEP="ingest"
corpus=$(compose exec -T retriever python -c 'import pathlib, services; print(pathlib.Path(services.__file__).parent / "demo_data" / "hotpotqa_corpus.jsonl")' | tr -d '\r')
log "ingest: $corpus (the shipped demo corpus) into the retriever"
compose exec -T retriever bridge-entrypoint bridge-rl ingest "$corpus" --url http://127.0.0.1:8001 2>"$WORK/ingest.err" \
  | python3 -c 'import json, sys; r = json.load(sys.stdin); print("  ingested:", r)' \
  || { cat "$WORK/ingest.err"; die "ingest"; }
echo "  retriever /readyz (through retriever-lb): $(api "$R/readyz")"
DOCS=$(api "$R/readyz" | python3 -c 'import json, sys; print(json.load(sys.stdin)["documents"])')
[ "$DOCS" -gt 0 ] || die "no document in the retriever"
R00=$(active "$R")
replicas_on "$R00" "$DOCS" || die "the $RETRIEVERS retriever replicas do not all hold the $DOCS documents at $R00"

STEP="ask"
QUESTION=$(head -1 services/demo_data/hotpotqa_train.jsonl | python3 -c 'import json, sys; print(json.load(sys.stdin)["question"])')
log "ask over REST: $QUESTION"
TIMEOUT=600 api "$P/v1/agent/query" -H 'content-type: application/json' \
  -d "$(python3 -c 'import json, sys; print(json.dumps({"question": sys.argv[1], "max_turns": 1}))' "$QUESTION")" \
  | python3 -c 'import json, sys; r = json.load(sys.stdin); print("  answer:", repr(r.get("answer")), "| policy", r.get("policy_version"), "| retriever", r.get("retriever_version"))' \
  || die "POST /v1/agent/query"

STEP="versions before"
R0=$(active "$R"); P0=$(active "$P")
log "active before training: retriever $R0, policy $P0"

STEP="train"
RUN=smoke-$(date +%s)
log "train: 1 round, 1 question, G=2, max_turns 1 on the worker service (run $RUN)"
compose exec -T worker bridge-rl train --algo bridge --rounds 1 --questions-per-round 1 --group-size 2 --max-turns 1 \
  --run-id "$RUN" >"$WORK/train.log" 2>&1 &
TRAIN_PID=$!
deadline=$((SECONDS + TRAIN_TIMEOUT))
while kill -0 "$TRAIN_PID" 2>/dev/null; do
  [ "$SECONDS" -lt "$deadline" ] || { kill "$TRAIN_PID"; tail -20 "$WORK/train.log"; die "no round after ${TRAIN_TIMEOUT}s"; }
  sleep 30
  worker=$(compose logs --no-color --no-log-prefix --tail=1 worker 2>/dev/null | tail -1 | cut -c1-130)
  log "train: running | worker: $worker"
done
wait "$TRAIN_PID" || { tail -30 "$WORK/train.log"; die "bridge-rl train"; }
TRAIN_PID=""
grep -E "^round|^run " "$WORK/train.log" | sed 's/^/  /'

STEP="hot swap"
R1=$(active "$R"); P1=$(active "$P")
log "active after training: retriever $R1, policy $P1"
[ "$R1" != "$R0" ] || die "the retriever still serves $R0"
replicas_on "$R1" "$DOCS" || die "not every retriever replica serves $R1"
[ "$P1" != "$P0" ] || die "the policy still serves $P0"

STEP="rollback"
for svc in "$R" "$P"; do
  TIMEOUT=600 api -X POST "$svc/v1/checkpoints/rollback" -H "Authorization: Bearer $TOKEN" >/dev/null \
    || die "rollback on $svc"
done
R2=$(active "$R"); P2=$(active "$P")
log "active after rollback: retriever $R2, policy $P2"
[ "$R2" = "$R0" ] && [ "$P2" = "$P0" ] || die "rollback did not restore $R0 / $P0"
replicas_on "$R0" "$DOCS" || die "not every retriever replica is back on $R0"
STEP="down"
