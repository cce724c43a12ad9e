#!/usr/bin/env bash
# Builds a Python base image from Debian packages alone, for machines that reach
# the Debian archive but no image registry: debootstrap (minbase) into a folder,
# then `docker import`. The result replaces python:3.11-slim as the Dockerfile's
# BASE_IMAGE (Debian bookworm's python3 is 3.11).
#
#   deploy/base-image.sh [IMAGE [PACKAGES]]
#
# With arguments it builds another image the same way: run.sh makes the
# PostgreSQL + haproxy image of the replicas stack with
#   deploy/base-image.sh bae-infra:bookworm postgresql,haproxy
#
# Cached by tag: nothing is done when the image already exists.
set -euo pipefail

IMAGE="${1:-${BAE_BASE_IMAGE:-bae-base:bookworm}}"
SUITE="${BAE_BASE_SUITE:-bookworm}"
MIRROR="${BAE_BASE_MIRROR:-http://deb.debian.org/debian}"
PACKAGES="${2:-python3,python3-venv,ca-certificates}"

log() { echo "base-image: $*" >&2; }

if docker image inspect "$IMAGE" >/dev/null 2>&1; then
    log "$IMAGE already present"
    exit 0
fi
if ! command -v debootstrap >/dev/null 2>&1; then
    log "installing debootstrap"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends debootstrap >/dev/null
fi

root="$(mktemp -d)"
output="$(mktemp)"
trap 'rm -rf "$root" "$output"' EXIT
log "debootstrap $SUITE ($PACKAGES) from $MIRROR"
if ! debootstrap --variant=minbase --include="$PACKAGES" "$SUITE" "$root" "$MIRROR" >"$output" 2>&1; then
    tail -n 30 "$output" >&2
    exit 1
fi
# What an image never needs: package caches, indexes, documentation, locales.
rm -rf "$root"/var/cache/apt/archives/*.deb "$root"/var/lib/apt/lists/* \
    "$root"/usr/share/doc/* "$root"/usr/share/man/* "$root"/usr/share/info/* "$root"/usr/share/locale/*
tar -C "$root" -c . | docker import \
    --change 'ENV LANG=C.UTF-8' \
    --change 'CMD ["python3"]' \
    - "$IMAGE" >/dev/null
log "built $IMAGE ($(docker image inspect --format '{{.Size}}' "$IMAGE" | awk '{printf "%.0f MB", $1/1e6}'))"
