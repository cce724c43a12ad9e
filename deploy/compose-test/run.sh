#!/usr/bin/env bash
# `make compose-test`: the docker-compose deployment, built and tested end to end.
#
# Nothing is pulled from an image registry: the base image comes from Debian
# packages (deploy/base-image.sh, cached by tag), the Python dependencies from
# a wheelhouse filled on this machine, so the image build needs no network.
# COMPOSE selects the client (default docker-compose; e.g. COMPOSE="docker compose").
set -euo pipefail
cd "$(dirname "$0")/../.."

export COMPOSE="${COMPOSE:-docker-compose}"
export BAE_BASE_IMAGE="${BAE_BASE_IMAGE:-bae-base:bookworm}"
export BAE_INFRA_BASE_IMAGE="${BAE_INFRA_BASE_IMAGE:-bae-infra:bookworm}"
export BAE_PIP_NO_INDEX=1
export BAE_IMAGE_PREFIX="${BAE_IMAGE_PREFIX:-bae}"
export BAE_IMAGE_TAG="${BAE_IMAGE_TAG:-latest}"
export BAE_CONFIG_FILE="$PWD/deploy/compose-test/bae-config.toml"
export BAE_E2E_PROJECT="${BAE_E2E_PROJECT:-bae-e2e}"
export BAE_SHUTDOWN_TIMEOUT=30
export BAE_LOG=info
export MOCK_LLM_TOKEN="mock-token-$RANDOM$RANDOM"
export BAE_INTERNAL_TOKEN="$(.venv/bin/python -c 'import secrets; print(secrets.token_hex(32))')"
# The sandbox hosts run as the image's user, in the group that owns the Docker socket.
export BAE_SANDBOX_USER="10001:$(stat -c %g /var/run/docker.sock)"
free_port() { .venv/bin/python -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
export BAE_PUBLISH_ADDR="127.0.0.1:$(free_port)"
export BAE_E2E_MOCK_PORT="$(free_port)"
# The load balancer of the replicas stack (test_replicas.py).
export BAE_REPLICAS_PUBLISH_ADDR="127.0.0.1:$(free_port)"

log() { echo "compose-test: $*" >&2; }
compose() { $COMPOSE -p "$BAE_E2E_PROJECT" -f docker-compose.yml -f deploy/compose-test/docker-compose.test.yml "$@"; }
replicas() { $COMPOSE -p "$BAE_E2E_PROJECT-replicas" -f docker-compose.replicas.yml "$@"; }

if ! command -v docker-compose >/dev/null 2>&1; then
    log "installing docker-compose"
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends docker-compose >/dev/null \
        || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends docker-compose >/dev/null; }
fi
# Whatever happens below, the test project is gone afterwards.
# Images superseded by this build are pruned too, so repeated runs do not pile them up.
trap 'compose down -v --remove-orphans -t 40 >/dev/null 2>&1 || true
      BAE_POSTGRES_PASSWORD=unused replicas down -v --remove-orphans -t 40 >/dev/null 2>&1 || true
      docker image prune -f --filter label=bae.image=1 >/dev/null 2>&1 || true' EXIT

log "validating docker-compose.yml and docker-compose.replicas.yml"
compose config -q
BAE_POSTGRES_PASSWORD=unused replicas config -q
log "images: base $BAE_BASE_IMAGE, infra base $BAE_INFRA_BASE_IMAGE"
bash deploy/images.sh
# -s: the tests' progress lines (stack up, kills, the failover times they measure) show as they happen.
.venv/bin/python -m pytest -p no:cacheprovider -q -s deploy/compose-test/test_compose.py deploy/compose-test/test_replicas.py
