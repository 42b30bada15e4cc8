# The load balancer in front of the retriever's replicas (`docker compose up --scale retriever=N`): Debian's
# HAProxy, configured by `bridge-rl balance` to follow every address Docker's DNS gives for the service name.
ARG BASE_IMAGE=bridge-base
FROM ${BASE_IMAGE}
RUN set -eu; export DEBIAN_FRONTEND=noninteractive; apt-get update -q; \
    apt-get install -y -q --no-install-recommends haproxy; rm -rf /var/lib/apt/lists/*
EXPOSE 8001
CMD ["bridge-rl", "balance", "retriever:8001", "--port", "8001"]
