# Celery trainer workers: scale with `docker compose up --scale worker=N` (or worker-gpu).
ARG BASE_IMAGE=bridge-base
FROM ${BASE_IMAGE}
# The experiment trackers of a run's report_to (TensorBoard, W&B, MLflow): only the trainer logs to them.
RUN pip install -q -c /opt/bridge/constraints.txt "bridge-rl[trackers]"
# The GPU profile swaps the base's CPU torch for the same release built for CUDA (empty: keep the CPU build).
ARG TORCH_INDEX=""
RUN if [ -n "$TORCH_INDEX" ]; then pip install --force-reinstall --no-deps "torch==2.13.0" --index-url "$TORCH_INDEX"; fi
CMD ["bridge-rl", "worker"]
