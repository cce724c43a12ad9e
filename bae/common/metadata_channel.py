"""A channel whose every call carries metadata added at call time.

The stubs built on a `MetadataChannel` send, with each call, what `add` returns
for the call's own metadata (the internal token, the request id, the trace
context). grpc.aio client interceptors could do the same, but an intercepted
call runs its interceptor chain in a task of its own and hands each streamed
response through one more async iterator; with two interceptors on every
internal channel that was about a tenth of the session service's CPU per turn.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import grpc

from bae.common.channel_wrapper import ChannelWrapper

Metadata = Sequence[tuple[str, str | bytes]]
AddMetadata = Callable[[Metadata | None], Metadata]


class _AddingMetadata:
    """One multicallable of the wrapped channel, with `add` applied to each call's metadata."""

    __slots__ = ("_call", "_add")

    def __init__(self, call: Any, add: AddMetadata) -> None:
        self._call = call
        self._add = add

    def __call__(self, request: Any = None, *, metadata: Metadata | None = None, **kwargs: Any) -> Any:
        # `request` is a stream call's iterator, None for one written to with `write()`.
        return self._call(request, metadata=self._add(metadata), **kwargs)


class MetadataChannel(ChannelWrapper):
    """Wraps `channel`; everything but the multicallables is the wrapped channel's own."""

    def __init__(self, channel: grpc.aio.Channel, add: AddMetadata) -> None:
        super().__init__(channel)
        self._add = add

    def unary_unary(self, *args: Any, **kwargs: Any) -> Any:
        return _AddingMetadata(self._channel.unary_unary(*args, **kwargs), self._add)

    def unary_stream(self, *args: Any, **kwargs: Any) -> Any:
        return _AddingMetadata(self._channel.unary_stream(*args, **kwargs), self._add)

    def stream_unary(self, *args: Any, **kwargs: Any) -> Any:
        return _AddingMetadata(self._channel.stream_unary(*args, **kwargs), self._add)

    def stream_stream(self, *args: Any, **kwargs: Any) -> Any:
        return _AddingMetadata(self._channel.stream_stream(*args, **kwargs), self._add)
