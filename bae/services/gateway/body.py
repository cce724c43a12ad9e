"""Request bodies, bounded (BAE_MAX_BODY_BYTES): by Content-Length first, then counted as they arrive.

A body larger than PRECHECK_BYTES, or of unannounced length, is read only
after the session service accepted the request's credential, so a client
without a key cannot make the gateway hold more than that in memory.
"""

from __future__ import annotations

from typing import TypeAlias

import grpc
from starlette.requests import Request

from bae.common.errors import InvalidInput, TooLarge
from bae.common.protos import edge_pb2, session_pb2
from bae.services.gateway.upstream import Upstream, credential_of

CredentialKind: TypeAlias = edge_pb2.CredentialKind.ValueType

# Bodies up to this size are read at once; the call itself authenticates them.
PRECHECK_BYTES = 64 * 1024


class BodyReader:
    def __init__(self, upstream: Upstream, max_bytes: int) -> None:
        self.upstream = upstream
        self.max_bytes = max_bytes

    async def read(self, request: Request, credential: CredentialKind, session_id: str = "") -> bytes:
        """The whole body; raises TooLarge, InvalidInput, or the credential's refusal instead.
        `credential` is the route's kind of key; a session key's session is `session_id`."""
        declared = content_length(request)
        if declared is None and "transfer-encoding" not in request.headers:
            return b""  # HTTP/1.1: neither header, no body
        if declared is not None and declared > self.max_bytes:
            raise self.too_large()
        if declared is None or declared > PRECHECK_BYTES:
            await self.check(request, credential, session_id)
        return await read_within(request, self.max_bytes, self.too_large())

    def too_large(self) -> TooLarge:
        return TooLarge(f"request body exceeds the limit of {self.max_bytes} bytes (BAE_MAX_BODY_BYTES)")

    async def check(self, request: Request, credential: CredentialKind, session_id: str = "") -> None:
        """Authenticate the request's credential, and nothing else; raises its refusal."""
        check = session_pb2.CredentialCheck(kind=credential, credential=credential_of(request), session_id=session_id)
        timeout = self.upstream.timeout
        try:
            await self.upstream.call(None, lambda stub, metadata: stub.CheckCredential(check, timeout=timeout))
        except grpc.aio.AioRpcError as error:
            raise self.upstream.failure(error) from None


def content_length(request: Request) -> int | None:
    """The declared body length; None without the header, InvalidInput for one that is not a number."""
    value = request.headers.get("content-length")
    if value is None:
        return None
    if not value.strip().isdigit():
        raise InvalidInput("invalid Content-Length header")
    return int(value)


async def read_within(request: Request, max_bytes: int, too_large: TooLarge) -> bytes:
    """The body as it arrives, counted: raises `too_large` once it passes `max_bytes`."""
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > max_bytes:
            raise too_large
        chunks.append(chunk)
    return b"".join(chunks)
