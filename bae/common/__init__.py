"""What the services share: settings and config, errors, ids, JSON text, logs, telemetry, and running gRPC.

Nothing here imports a service or the client library; importing the package itself loads nothing
(tools/genproto.py imports `protodigest` from it before any dependency is installed).
"""
