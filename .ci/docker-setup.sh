#!/usr/bin/env bash
# Makes Docker usable for the sandbox tests on a fresh Debian machine (root, no image registry).
#
# Idempotent: installs docker.io + busybox-static only when missing, starts dockerd only
# when `docker info` fails, builds the local image bae-busybox:test only when absent.
# The image is made from busybox-static because nothing can be pulled from a registry.
set -euo pipefail

IMAGE="${BAE_TEST_IMAGE:-bae-busybox:test}"
DOCKERD_LOG="${DOCKERD_LOG:-/var/log/bae-dockerd.log}"
DOCKERD_WAIT_SECONDS="${DOCKERD_WAIT_SECONDS:-60}"

log() { echo "docker-setup: $*" >&2; }

install_packages() {
    local missing=()
    command -v dockerd >/dev/null 2>&1 || missing+=(docker.io)
    [ -x /bin/busybox ] || missing+=(busybox-static)
    if [ "${#missing[@]}" -eq 0 ]; then
        return
    fi
    log "installing ${missing[*]}"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
}

start_dockerd() {
    if docker info >/dev/null 2>&1; then
        return
    fi
    log "starting dockerd (log: $DOCKERD_LOG)"
    # containerd ships with docker.io; dockerd starts its own managed instance when none runs.
    nohup dockerd >"$DOCKERD_LOG" 2>&1 &
    local waited=0
    until docker info >/dev/null 2>&1; do
        if [ "$waited" -ge "$DOCKERD_WAIT_SECONDS" ]; then
            log "ERROR: dockerd did not become ready within ${DOCKERD_WAIT_SECONDS}s; last log lines:"
            tail -n 30 "$DOCKERD_LOG" >&2 || true
            exit 1
        fi
        sleep 1
        waited=$((waited + 1))
    done
    log "dockerd ready after ${waited}s"
}

build_image() {
    if docker image inspect "$IMAGE" >/dev/null 2>&1; then
        return
    fi
    log "building $IMAGE from busybox-static"
    local root
    root="$(mktemp -d)"
    trap 'rm -rf "$root"' RETURN
    mkdir -p "$root/bin" "$root/tmp" "$root/etc" "$root/root"
    cp /bin/busybox "$root/bin/busybox"
    local applet
    for applet in $(/bin/busybox --list); do
        [ "$applet" = busybox ] || ln -sf busybox "$root/bin/$applet"
    done
    ln -sf busybox "$root/bin/sh"
    chmod 1777 "$root/tmp"
    echo "root:x:0:0:root:/root:/bin/sh" >"$root/etc/passwd"
    echo "root:x:0:" >"$root/etc/group"
    tar -C "$root" -c . | docker import \
        --change 'ENV PATH=/bin' \
        --change 'CMD ["/bin/sh"]' \
        - "$IMAGE" >/dev/null
    log "built $IMAGE"
}

install_packages
start_dockerd
build_image
