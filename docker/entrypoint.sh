#!/bin/sh
# Entrypoint of every BRIDGE image: reads the admin token from the compose secret (a file mounted at
# /run/secrets/admin_token) into BRIDGE_ADMIN_TOKEN for this process only, so that it never sits in the container's
# configuration (`docker inspect`) nor in a service that does not need it. Without the secret: unchanged.
set -eu
secret=${BRIDGE_ADMIN_TOKEN_SECRET:-/run/secrets/admin_token}  # the variable: for tests
if [ -z "${BRIDGE_ADMIN_TOKEN:-}" ] && [ -e "$secret" ]; then
  if [ ! -f "$secret" ] || [ ! -r "$secret" ]; then
    echo "bridge-entrypoint: $secret is not a readable file (write the token into docker/secrets/admin_token," \
         "or point BRIDGE_ADMIN_TOKEN_FILE at one, before docker compose up)" >&2
    exit 1
  fi
  BRIDGE_ADMIN_TOKEN=$(tr -d '\r\n' < "$secret")
  if [ "${#BRIDGE_ADMIN_TOKEN}" -lt 16 ] || [ "$BRIDGE_ADMIN_TOKEN" = "change-me-to-a-long-random-string" ]; then
    echo "bridge-entrypoint: the admin token in $secret is a placeholder or shorter than 16 characters" >&2
    exit 1
  fi
  export BRIDGE_ADMIN_TOKEN
fi
exec "$@"
