"""The generated gRPC modules, checked against their .proto sources.

Import contracts from here, never from `bae.proto` directly:

    from bae.common.protos import session_pb2, session_pb2_grpc
"""

from __future__ import annotations

from bae.common.protodigest import PROTO_ROOT, proto_digest

try:
    import bae.proto as baeproto
except ImportError as exc:  # pragma: no cover - exercised by a fresh clone
    raise ImportError("generated protobuf code is missing: run `make protos`") from exc

# A checkout without protos/ (an installed image) trusts what it shipped with.
if PROTO_ROOT.is_dir() and baeproto.SOURCE_DIGEST != proto_digest():
    raise ImportError("generated protobuf code is stale (protos/ changed): run `make protos`")

from bae.proto.v1 import (  # noqa: E402
    admin_api_pb2,
    client_api_pb2,
    edge_pb2,
    errors_pb2,
    runner_pb2,
    runner_pb2_grpc,
    sandbox_pb2,
    sandbox_pb2_grpc,
    session_pb2,
    session_pb2_grpc,
)

__all__ = [
    "admin_api_pb2",
    "client_api_pb2",
    "edge_pb2",
    "errors_pb2",
    "runner_pb2",
    "runner_pb2_grpc",
    "sandbox_pb2",
    "sandbox_pb2_grpc",
    "session_pb2",
    "session_pb2_grpc",
]
