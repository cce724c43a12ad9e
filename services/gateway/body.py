"""Request bodies, bounded (BAE_MAX_BODY_BYTES): by Content-Length first, then counted as they arrive.

A body larger than PRECHECK_BYTES, or of unannounced length, is read only
after the session service accepted the request's credential, so a client
without a key cannot make the gateway hold more than that in memory.
"""

from __future__ import annotations

import grpc
from starlette.requests import Request

from bae.common.errors import bad_request, payload_too_large
from bae.common.protos import session_pb2
from services.gateway.upstream import Upstream, credentials

Credential = session_pb2.CredentialCheck.Credential
CLIENT_KEY = session_pb2.CredentialCheck.CLIENT_KEY
SESSION_KEY = session_pb2.CredentialCheck.SESSION_KEY
ADMIN_KEY = session_pb2.CredentialCheck.ADMIN_KEY

# Bodies up to this size are read at once; the call itself authenticates them.
PRECHECK_BYTES = 64 * 1024


class BodyReader:
    def __init__(self, upstream: Upstream, max_bytes: int) -> None:
        self.upstream = upstream
        self.max_bytes = max_bytes

    async def read(self, request: Request, credential: Credential) -> bytes:
        """The whole body; raises a Problem (413, 400, or the credential's 401) instead."""
        declared = _content_length(request)
        if declared is None and "transfer-encoding" not in request.headers:
            return b""  # HTTP/1.1: neither header, no body
        if declared is not None and declared > self.max_bytes:
            raise payload_too_large(self.max_bytes)
        if declared is None or declared > PRECHECK_BYTES:
            await self._check(request, credential)
        chunks: list[bytes] = []
        size = 0
        async for chunk in request.stream():
            size += len(chunk)
            if size > self.max_bytes:
                raise payload_too_large(self.max_bytes)
            chunks.append(chunk)
        return b"".join(chunks)

    async def _check(self, request: Request, credential: Credential) -> None:
        check = session_pb2.CredentialCheck(
            credential=credential, path_id=request.path_params.get("id", ""), **credentials(request)
        )
        timeout = self.upstream.timeout
        try:
            await self.upstream.call(None, lambda stub, metadata: stub.CheckCredential(check, timeout=timeout))
        except grpc.aio.AioRpcError as error:
            raise self.upstream.failure(error) from None


def _content_length(request: Request) -> int | None:
    value = request.headers.get("content-length")
    if value is None:
        return None
    if not value.strip().isdigit():
        raise bad_request("invalid Content-Length header")
    return int(value)
