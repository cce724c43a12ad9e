"""Client interceptors that add metadata to every call of a channel.

grpc.aio files an interceptor under the first call kind it implements only
(unary-unary before unary-stream), so one object cannot serve both: each kind
gets its own interceptor around the same `add` function.
"""

from __future__ import annotations

from typing import Any, Callable

import grpc

AddMetadata = Callable[[grpc.aio.ClientCallDetails], grpc.aio.ClientCallDetails]


class _UnaryUnary(grpc.aio.UnaryUnaryClientInterceptor):
    def __init__(self, add: AddMetadata) -> None:
        self._add = add

    async def intercept_unary_unary(self, continuation: Any, client_call_details: Any, request: Any) -> Any:
        return await continuation(self._add(client_call_details), request)


class _UnaryStream(grpc.aio.UnaryStreamClientInterceptor):
    def __init__(self, add: AddMetadata) -> None:
        self._add = add

    async def intercept_unary_stream(self, continuation: Any, client_call_details: Any, request: Any) -> Any:
        return await continuation(self._add(client_call_details), request)


def metadata_interceptors(add: AddMetadata) -> list[grpc.aio.ClientInterceptor]:
    """Interceptors that pass every unary and server-streaming call's details through `add`."""
    return [_UnaryUnary(add), _UnaryStream(add)]
