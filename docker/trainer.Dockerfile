# Celery trainer workers: scale with `docker compose up --scale worker=N`.
ARG BASE_IMAGE=bridge-base
FROM ${BASE_IMAGE}
CMD ["bridge-rl", "worker"]
