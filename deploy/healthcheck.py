"""Container health probe: `python healthcheck.py gateway|session|runner|sandbox`.

Probes the service on the address its own variables make it listen on, over
loopback: gRPC health for the internal services, GET /readyz for the gateway
(ready only while the session service and the runner answer).
Exits 0 when healthy, 1 otherwise (Docker's HEALTHCHECK convention).
"""

from __future__ import annotations

import os
import sys
import urllib.request

from bae.launcher.stack import grpc_serving

# The variable holding each service's listen address, and its image default.
LISTEN = {
    "gateway": ("BAE_ADDR", "0.0.0.0:8080"),
    "session": ("BAE_SESSION_GRPC_ADDR", "0.0.0.0:50051"),
    "runner": ("BAE_RUNNER_GRPC_ADDR", "0.0.0.0:50052"),
    "sandbox": ("BAE_SANDBOX_LISTEN_ADDR", "0.0.0.0:50053"),
}


def loopback(address: str) -> str:
    """The same port on loopback: a wildcard bind answers there too."""
    host, _, port = address.rpartition(":")
    return f"[::1]:{port}" if host in ("[::]", "::") else f"127.0.0.1:{port}" if host in ("0.0.0.0", "") else address


def healthy(service: str) -> bool:
    var, default = LISTEN[service]
    address = loopback(os.environ.get(var, default))
    if service != "gateway":
        return grpc_serving(address)
    try:
        with urllib.request.urlopen(f"http://{address}/readyz", timeout=2) as response:
            return response.status == 200
    except OSError:
        return False


if __name__ == "__main__":
    if len(sys.argv) != 2 or sys.argv[1] not in LISTEN:
        print(f"usage: healthcheck.py {'|'.join(LISTEN)}", file=sys.stderr)
        raise SystemExit(2)
    raise SystemExit(0 if healthy(sys.argv[1]) else 1)
