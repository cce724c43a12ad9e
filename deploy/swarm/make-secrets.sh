#!/usr/bin/env bash
# Creates the Docker secrets deploy/swarm/stack.yml reads, on a swarm manager:
#
#   <prefix>_internal_token     the internal gRPC plane's shared token (64 hex characters)
#   <prefix>_postgres_password  the database password (48 hex characters)
#   <prefix>_admin_key          an admin key's plaintext, which `baectl` in a gateway task reads
#   <prefix>_admin_key_hash     its Argon2id hash, ingested by the store on its first start
#
#   deploy/swarm/make-secrets.sh [PREFIX]      (default PREFIX: $BAE_SECRET_PREFIX or bae)
#
# Idempotent: a secret that exists is kept (Docker secrets cannot change; to rotate one,
# create it under a new name and point the stack at it). The admin key pair is made by
# `baectl auth create key` inside the gateway image (BAE_IMAGE_PREFIX, BAE_IMAGE_TAG), in a
# temporary folder removed afterwards. No value is printed: read the admin key, when you
# need it outside, with `docker exec <gateway task> cat /run/secrets/admin_key`.
set -euo pipefail

PREFIX="${1:-${BAE_SECRET_PREFIX:-bae}}"
GATEWAY_IMAGE="${BAE_IMAGE_PREFIX:-bae}-gateway:${BAE_IMAGE_TAG:-latest}"

log() { echo "make-secrets: $*" >&2; }

exists() { docker secret inspect "$1" >/dev/null 2>&1; }

random_hex() { head -c "$1" /dev/urandom | od -An -tx1 | tr -d ' \n'; }

create() {  # create NAME, the value on stdin
    docker secret create --label bae.secret=1 "$1" - >/dev/null
    log "created $1"
}

if [ "$(docker info --format '{{.Swarm.ControlAvailable}}' 2>/dev/null)" != "true" ]; then
    log "this Docker engine is not a swarm manager; run it on a manager node (docker swarm init)"
    exit 1
fi

for name in internal_token postgres_password; do
    secret="${PREFIX}_${name}"
    if exists "$secret"; then
        log "$secret exists; kept"
        continue
    fi
    bytes=32
    [ "$name" = postgres_password ] && bytes=24
    random_hex "$bytes" | create "$secret"
done

if exists "${PREFIX}_admin_key" && exists "${PREFIX}_admin_key_hash"; then
    log "${PREFIX}_admin_key and ${PREFIX}_admin_key_hash exist; kept"
    exit 0
fi
if exists "${PREFIX}_admin_key" || exists "${PREFIX}_admin_key_hash"; then
    log "only one of ${PREFIX}_admin_key and ${PREFIX}_admin_key_hash exists; remove it and run this again"
    exit 1
fi
folder="$(mktemp -d)"
trap 'rm -rf "$folder"' EXIT
# The image's user writes into the folder; it holds nothing else and is removed on exit.
chmod 0777 "$folder"
docker run --rm --network none --volume "$folder:/out" "$GATEWAY_IMAGE" \
    baectl auth create key --out-dir /out --name swarm >/dev/null 2>&1 \
    || { log "baectl auth create key failed in $GATEWAY_IMAGE; is the image there (make images)?"; exit 1; }
create "${PREFIX}_admin_key" < "$folder/admin-key.pem"
create "${PREFIX}_admin_key_hash" < "$folder/admin-key-hash.pem"
