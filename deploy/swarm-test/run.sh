#!/usr/bin/env bash
# `make swarm-test`: the Docker Swarm stack (deploy/swarm/stack.yml) deployed and tested end to end.
#
# Makes this engine a one-node swarm when it is in none (and leaves the swarm afterwards),
# builds the images from local packages (deploy/images.sh, no registry needed), creates the
# stack's secrets (deploy/swarm/make-secrets.sh), deploys the stack with the test override
# and runs deploy/swarm-test/test_swarm.py, whose last test removes the stack and checks
# that nothing of it is left. Whatever happens, the exit trap removes what is left:
# the stack, its volumes, secrets and sandboxes, the node labels it added.
set -euo pipefail
cd "$(dirname "$0")/../.."

export BAE_REPO="$PWD"
export BAE_BASE_IMAGE="${BAE_BASE_IMAGE:-bae-base:bookworm}"
export BAE_INFRA_BASE_IMAGE="${BAE_INFRA_BASE_IMAGE:-bae-infra:bookworm}"
export BAE_PIP_NO_INDEX="${BAE_PIP_NO_INDEX:-1}"
export BAE_IMAGE_PREFIX="${BAE_IMAGE_PREFIX:-bae}"
version="$(.venv/bin/python -c 'import tomllib; print(tomllib.load(open("pyproject.toml", "rb"))["project"]["version"])')"
# The versioned tag `make images` sets, as a deployment pins it.
export BAE_IMAGE_TAG="${BAE_IMAGE_TAG:-$version}"
export BAE_POSTGRES_IMAGE="$BAE_IMAGE_PREFIX-infra:$BAE_IMAGE_TAG"
export BAE_SWARM_STACK="${BAE_SWARM_STACK:-bae-swarm-test}"
export BAE_SECRET_PREFIX="$BAE_SWARM_STACK"
export BAE_CONFIG_FILE="$PWD/deploy/compose-test/bae-config.toml"
export BAE_DOCKER_GID="$(stat -c %g /var/run/docker.sock)"
free_port() { .venv/bin/python -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
export BAE_E2E_MOCK_PORT="$(free_port)"

log() { echo "swarm-test: $*" >&2; }

if ! docker info >/dev/null 2>&1; then
    log "no Docker engine answers; start dockerd first (.ci/docker-setup.sh does)"
    exit 1
fi
joined=0
had_gwbridge=0
docker network inspect docker_gwbridge >/dev/null 2>&1 && had_gwbridge=1
node=""
added_labels=()
# What the stack leaves when removed (stack rm keeps volumes and external secrets), and what
# the sandbox hosts started through the Docker socket; then what this script changed of the
# engine. Run again, it finds nothing to do.
cleanup() {
    bash deploy/swarm-test/remove.sh "$BAE_SWARM_STACK" || true
    for label in "${added_labels[@]}"; do
        docker node update --label-rm "$label" "$node" >/dev/null 2>&1 || true
    done
    if [ "$joined" = 1 ]; then
        docker swarm leave --force >/dev/null 2>&1 || true
        # The bridge Swarm made for its tasks' traffic off the overlay networks.
        [ "$had_gwbridge" = 1 ] || docker network rm docker_gwbridge >/dev/null 2>&1 || true
        log "left the swarm"
    fi
}
trap cleanup EXIT
if [ "$(docker info --format '{{.Swarm.LocalNodeState}}')" != active ]; then
    log "docker swarm init (this engine is in no swarm; it leaves again at the end)"
    joined=1
    docker swarm init --advertise-addr 127.0.0.1 >/dev/null
fi
node="$(docker info --format '{{.Swarm.NodeID}}')"
for label in bae.sandbox bae.postgres; do
    if [ "$(docker node inspect --format "{{index .Spec.Labels \"$label\"}}" "$node")" != true ]; then
        added_labels+=("$label")
        docker node update --label-add "$label=true" "$node" >/dev/null
    fi
done

# A previous run that was killed before its trap ran.
bash deploy/swarm-test/remove.sh "$BAE_SWARM_STACK"

bash deploy/images.sh
bash deploy/swarm/make-secrets.sh "$BAE_SECRET_PREFIX"
head -c 24 /dev/urandom | od -An -tx1 | tr -d ' \n' \
    | docker secret create --label bae.secret=1 "${BAE_SECRET_PREFIX}_mock_token" - >/dev/null

# -s: the tests' progress lines (deploys, kills, the failover times they measure) show as they happen.
.venv/bin/python -m pytest -p no:cacheprovider -q -s deploy/swarm-test/test_swarm.py
