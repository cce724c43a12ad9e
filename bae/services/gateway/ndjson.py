"""The NDJSON routes (edge.proto, HttpRoute.ndjson): an export streamed out, an import streamed in.

An export (a server-streaming call) answers 200 once its first piece came, so a refusal (404,
401) is still a problem; the pieces after it are written as they come, each read within the
call's deadline. An import (a client-streaming call) authenticates first, then sends the body's
lines as they arrive, a few together per message; the body and each line are bounded
(bae.common.session_export), and a body that breaks a bound or is not UTF-8 cancels the call, so
nothing of it is written. Line numbers count from 1, every line (blank ones too).
"""

from __future__ import annotations

import asyncio
import logging
from typing import AsyncIterator

import grpc
from google.protobuf.message import Message
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse

from bae.common.errors import BaeError, Internal, InvalidInput, TooLarge
from bae.common.protos import admin_api_pb2, session_pb2_grpc
from bae.common.session_export import MAX_IMPORT_BYTES, MAX_LINE_BYTES, PIECE_CHARS
from bae.services.gateway.body import BodyReader, content_length
from bae.services.gateway.declaration import Route
from bae.services.gateway.problems import JSON, error_response
from bae.services.gateway.proto_to_json import writer_of
from bae.services.gateway.router import Endpoint
from bae.services.gateway.upstream import Metadata, Upstream, credential_of

log = logging.getLogger("bae.gateway")

NDJSON = "application/x-ndjson"


def ndjson_endpoint(route: Route, upstream: Upstream, bodies: BodyReader) -> Endpoint:
    if route.client_streaming:
        return _import_endpoint(route, upstream, bodies)
    return _export_endpoint(route, upstream)


def _export_endpoint(route: Route, upstream: Upstream) -> Endpoint:
    timeout = upstream.timeout

    async def handle(request: Request) -> Response:
        message = route.request()
        getattr(message, route.credential_field).CopyFrom(credential_of(request))
        setattr(message, route.id_field, request.path_params.get("id", ""))

        async def invoke(stub: session_pb2_grpc.SessionServiceStub, metadata: Metadata) -> tuple[grpc.aio.Call, object]:
            call = getattr(stub, route.rpc)(message, metadata=metadata)
            try:
                return call, await _read(call, timeout)
            except BaseException:
                call.cancel()
                raise

        try:
            call, first = await upstream.call(None, invoke)
        except grpc.aio.AioRpcError as error:
            return error_response(upstream.failure(error))
        if not isinstance(first, Message):
            log.error("session service ended %s without its first piece", route.rpc)
            return error_response(Internal("internal server error"))
        return StreamingResponse(_pieces(route.rpc, call, first, timeout), route.status, media_type=NDJSON)

    return handle


async def _read(call: grpc.aio.Call, timeout: float) -> object:
    try:
        async with asyncio.timeout(timeout):
            return await call.read()
    except TimeoutError:
        raise _deadline_exceeded() from None


def _deadline_exceeded() -> grpc.aio.AioRpcError:
    """A wait of the call's own that ran out, as the call's deadline would have ended it."""
    return grpc.aio.AioRpcError(
        grpc.StatusCode.DEADLINE_EXCEEDED, grpc.aio.Metadata(), grpc.aio.Metadata(), "Deadline Exceeded"
    )


async def _pieces(rpc: str, call: grpc.aio.Call, piece: object, timeout: float) -> AsyncIterator[bytes]:
    """The pieces' text as it comes. A call that fails now breaks the response off (no complete body)."""
    try:
        while isinstance(piece, Message):
            yield piece.text.encode()  # type: ignore[attr-defined]
            piece = await _read(call, timeout)
    except grpc.aio.AioRpcError as error:
        log.warning("%s stream failed: %s %s", rpc, error.code().name, error.details())
        raise
    finally:
        call.cancel()


def _import_endpoint(route: Route, upstream: Upstream, bodies: BodyReader) -> Endpoint:
    timeout = upstream.timeout
    write = writer_of(route.reply.DESCRIPTOR)

    async def handle(request: Request) -> Response:
        try:
            declared = content_length(request)
            if declared is not None and declared > MAX_IMPORT_BYTES:
                raise _too_large()
            # Authentication comes first, before a byte of the body is read.
            await bodies.check(request, route.credential)
        except BaeError as error:
            return error_response(error)
        first = route.request()
        getattr(first, route.credential_field).CopyFrom(credential_of(request))

        async def invoke(stub: session_pb2_grpc.SessionServiceStub, metadata: Metadata) -> Message:
            call = getattr(stub, route.rpc)(metadata=metadata)
            try:
                async with asyncio.timeout(timeout):
                    await call.write(first)
                async for lines in _lines(request):
                    async with asyncio.timeout(timeout):
                        await call.write(admin_api_pb2.ImportSessionRequest(lines=lines))
                async with asyncio.timeout(timeout):
                    await call.done_writing()
                    reply: Message = await call
                return reply
            except BaseException:
                call.cancel()  # the service writes nothing of an import that did not end
                raise

        try:
            reply = await upstream.call(None, invoke)
        except BaeError as error:
            return error_response(error)
        except TimeoutError:
            return error_response(upstream.failure(_deadline_exceeded()))
        except grpc.aio.AioRpcError as error:
            return error_response(upstream.failure(error))
        return Response(write(reply), route.status, media_type=JSON)

    return handle


def _too_large() -> TooLarge:
    return TooLarge(f"import body exceeds the limit of {MAX_IMPORT_BYTES} bytes")


async def _lines(request: Request) -> AsyncIterator[list[str]]:
    """The body's lines in batches of about PIECE_CHARS; raises TooLarge or InvalidInput at the first
    line that breaks a bound or is not UTF-8."""
    size = 0
    number = 0
    pending: list[bytes] = []  # the line being read, in the chunks it came in
    pending_bytes = 0
    batch: list[str] = []
    batch_chars = 0

    def line_of(raw: bytes) -> str:
        if len(raw) > MAX_LINE_BYTES:
            raise TooLarge(f"line {number} exceeds the limit of {MAX_LINE_BYTES} bytes")
        try:
            return raw.removesuffix(b"\r").decode("utf-8")
        except UnicodeDecodeError:
            raise InvalidInput(f"line {number} is not valid UTF-8") from None

    async for chunk in request.stream():
        size += len(chunk)
        if size > MAX_IMPORT_BYTES:
            raise _too_large()
        *complete, rest = chunk.split(b"\n")
        for index, part in enumerate(complete):
            number += 1
            line = line_of(b"".join([*pending, part]) if index == 0 and pending else part)
            if index == 0:
                pending, pending_bytes = [], 0
            batch.append(line)
            batch_chars += len(line)
        if rest:
            pending.append(rest)
            pending_bytes += len(rest)
            if pending_bytes > MAX_LINE_BYTES:
                number += 1
                raise TooLarge(f"line {number} exceeds the limit of {MAX_LINE_BYTES} bytes")
        if batch_chars >= PIECE_CHARS:
            yield batch
            batch, batch_chars = [], 0
    if pending:
        number += 1
        batch.append(line_of(b"".join(pending)))
    if batch:
        yield batch
