#!/usr/bin/env bash
# `make images`: the four service images (gateway, session, runner, sandbox) and the
# PostgreSQL + haproxy image of the replicas and Swarm stacks, tagged with the version.
#
#   make images                                   # bae-gateway:0.1.0 (and :latest), ...
#   BAE_IMAGE_PREFIX=registry.example.com/bae/bae BAE_PUSH=1 make images
#                                                 # registry.example.com/bae/bae-gateway:0.1.0, ..., pushed
#
# Variables (all optional):
#   BAE_IMAGE_PREFIX       image names' prefix, e.g. a registry path (default: bae)
#   BAE_IMAGE_TAG          the tag (default: the version in pyproject.toml); `latest` is set too
#   BAE_BASE_IMAGE         the Python base image (default: python:3.11-slim)
#   BAE_INFRA_BASE_IMAGE   the infra image's Debian base (default: debian:bookworm-slim)
#   BAE_PUSH=1             push the four service images' version tag once built (docker login first)
#   BAE_PIP_NO_INDEX=1     build without a package index: the wheels come from deploy/wheels,
#                          filled here first from this machine's pip
# A base image named bae-*:<suite> that does not exist yet is made from Debian packages
# (deploy/base-image.sh), for machines that reach no image registry.
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON="${PYTHON:-$( [ -x .venv/bin/python ] && echo .venv/bin/python || echo python3 )}"
VERSION="$("$PYTHON" -c 'import tomllib; print(tomllib.load(open("pyproject.toml", "rb"))["project"]["version"])')"
PREFIX="${BAE_IMAGE_PREFIX:-bae}"
TAG="${BAE_IMAGE_TAG:-$VERSION}"
BASE_IMAGE="${BAE_BASE_IMAGE:-python:3.11-slim}"
INFRA_BASE_IMAGE="${BAE_INFRA_BASE_IMAGE:-debian:bookworm-slim}"
PIP_NO_INDEX="${BAE_PIP_NO_INDEX:-0}"
PUSH="${BAE_PUSH:-0}"

log() { echo "images: $*" >&2; }

# Base images of our own making, when asked for by name and not there yet.
case "$BASE_IMAGE" in bae-*) bash deploy/base-image.sh "$BASE_IMAGE" ;; esac
case "$INFRA_BASE_IMAGE" in bae-*) bash deploy/base-image.sh "$INFRA_BASE_IMAGE" postgresql,haproxy ;; esac

if [ "$PIP_NO_INDEX" = 1 ]; then
    log "wheelhouse deploy/wheels"
    if ! output="$("$PYTHON" -m pip wheel --quiet -w deploy/wheels -r requirements.txt -c constraints.txt \
            'setuptools>=70.1' 2>&1)"; then
        echo "$output" >&2
        exit 1
    fi
fi

tags() {  # tags NAME: the -t options of one image
    echo "-t $PREFIX-$1:$TAG"
    [ "$TAG" = latest ] || echo "-t $PREFIX-$1:latest"
}

build() {  # build ARGS...: docker build, its output shown only when it fails
    local output
    if ! output="$(docker build --quiet --label bae.version="$VERSION" "$@" 2>&1)"; then
        echo "$output" >&2
        exit 1
    fi
}

start=$SECONDS
for target in gateway session runner sandbox; do
    log "building $PREFIX-$target:$TAG"
    # shellcheck disable=SC2046
    build --target "$target" --build-arg BASE_IMAGE="$BASE_IMAGE" --build-arg PIP_NO_INDEX="$PIP_NO_INDEX" \
        $(tags "$target") .
done
log "building $PREFIX-infra:$TAG"
# shellcheck disable=SC2046
build -f deploy/infra/Dockerfile --build-arg INFRA_BASE_IMAGE="$INFRA_BASE_IMAGE" $(tags infra) .
log "built in $((SECONDS - start))s: $PREFIX-{gateway,session,runner,sandbox,infra}:$TAG"
if [ "$PUSH" = 1 ]; then
    for target in gateway session runner sandbox; do
        log "pushing $PREFIX-$target:$TAG"
        docker push --quiet "$PREFIX-$target:$TAG" >/dev/null
    done
fi
