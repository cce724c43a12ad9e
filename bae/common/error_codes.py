"""The internal plane's one table of errors: each kind of `bae.common.errors` is one gRPC
status code, and the `bae-error-bin` trailer (an `ErrorInfo`) carries its reason, detail and
retry hint. A server ends a call that raised a kind with `abort`; the client gets the same
kind back from `raised_by`, so a refusal reads the same in every service it crosses.
"""

from __future__ import annotations

import grpc

from bae.common import errors
from bae.common.protos import errors_pb2

TRAILER = "bae-error-bin"

CODES: dict[type[errors.BaeError], grpc.StatusCode] = {
    errors.InvalidInput: grpc.StatusCode.INVALID_ARGUMENT,
    errors.Unauthenticated: grpc.StatusCode.UNAUTHENTICATED,
    errors.Forbidden: grpc.StatusCode.PERMISSION_DENIED,
    errors.NotFound: grpc.StatusCode.NOT_FOUND,
    # Google's API design guide: ABORTED and ALREADY_EXISTS are 409; FAILED_PRECONDITION is a
    # state the request cannot be served in, here the 422 kind.
    errors.Conflict: grpc.StatusCode.ABORTED,
    errors.Unprocessable: grpc.StatusCode.FAILED_PRECONDITION,
    errors.TooLarge: grpc.StatusCode.OUT_OF_RANGE,
    errors.TooManyRequests: grpc.StatusCode.RESOURCE_EXHAUSTED,
    errors.Unavailable: grpc.StatusCode.UNAVAILABLE,
    errors.DeadlineExceeded: grpc.StatusCode.DEADLINE_EXCEEDED,
    errors.Internal: grpc.StatusCode.INTERNAL,
}
KINDS: dict[grpc.StatusCode, type[errors.BaeError]] = {code: kind for kind, code in CODES.items()}


def code_of(error: errors.BaeError) -> grpc.StatusCode:
    """The status code of `error`'s kind (its nearest listed base class)."""
    for kind in type(error).__mro__:
        if kind in CODES:
            return CODES[kind]
    return grpc.StatusCode.INTERNAL


def trailer(error: errors.BaeError) -> tuple[str, bytes]:
    info = errors_pb2.ErrorInfo(reason=error.reason, detail=error.detail, retry_after=error.retry_after or 0)
    return TRAILER, info.SerializeToString()


async def abort(context: grpc.aio.ServicerContext, error: errors.BaeError) -> None:
    """End the call being served with `error` (raises, as `context.abort` does)."""
    context.set_trailing_metadata((trailer(error),))
    await context.abort(code_of(error), error.detail)


def raised_by(failure: grpc.aio.AioRpcError) -> errors.BaeError | None:
    """The error kind a failed call ended with; None when the server sent none (a transport
    failure, or a server that raised nothing of ours)."""
    for key, value in failure.trailing_metadata() or ():
        if key == TRAILER and isinstance(value, bytes):
            info = errors_pb2.ErrorInfo.FromString(value)
            kind = KINDS.get(failure.code(), errors.Internal)
            return kind(info.detail, reason=info.reason, retry_after=info.retry_after or None)
    return None
