#!/usr/bin/env bash
# Removes a stack of deploy/swarm/stack.yml and everything it leaves behind:
#
#   deploy/swarm-test/remove.sh STACK
#
# `docker stack rm` keeps the named volumes (the database) and external secrets on purpose;
# a test run must leave neither. Sandboxes are containers the sandbox hosts started through
# the Docker socket, not tasks of the stack: those whose host id starts with STACK go too.
# The secrets removed are those named STACK_* that make-secrets.sh made (label bae.secret).
# Idempotent: nothing left, nothing done.
set -euo pipefail

STACK="${1:?usage: remove.sh STACK}"
WAIT_SECONDS="${BAE_REMOVE_WAIT_SECONDS:-120}"

log() { echo "swarm-test: $*" >&2; }

in_stack() { docker "$@" --filter "label=com.docker.stack.namespace=$STACK" -q; }

if [ -n "$(docker stack ls --format '{{.Name}}' 2>/dev/null | grep -Fx "$STACK" || true)" ]; then
    log "docker stack rm $STACK"
    docker stack rm "$STACK" >/dev/null
fi
# Tasks stop within their grace period; volumes and networks can go only after.
waited=0
while [ -n "$(in_stack ps -a)" ] || [ -n "$(in_stack network ls)" ]; do
    if [ "$waited" -ge "$WAIT_SECONDS" ]; then
        log "the stack's containers or networks are still there after ${WAIT_SECONDS}s"
        docker ps -a --filter "label=com.docker.stack.namespace=$STACK" >&2
        exit 1
    fi
    # A container whose task is gone but which did not stop (a killed dockerd, say).
    [ "$waited" -lt 60 ] || in_stack ps -a | xargs -r docker rm -f >/dev/null 2>&1 || true
    sleep 1
    waited=$((waited + 1))
done
volumes="$(in_stack volume ls)"
[ -z "$volumes" ] || docker volume rm $volumes >/dev/null
sandboxes="$(docker ps -aq --filter label=bae.host | xargs -r docker inspect \
    --format '{{.Id}} {{index .Config.Labels "bae.host"}}' | awk -v prefix="$STACK-" 'index($2, prefix) == 1 {print $1}')"
[ -z "$sandboxes" ] || docker rm -f $sandboxes >/dev/null
secrets="$(docker secret ls --filter label=bae.secret=1 --format '{{.Name}}' 2>/dev/null | grep "^${STACK}_" || true)"
[ -z "$secrets" ] || docker secret rm $secrets >/dev/null
