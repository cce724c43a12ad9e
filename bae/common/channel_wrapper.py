"""A `grpc.aio.Channel` that hands everything to the channel it wraps, for wrappers that change a part."""

from __future__ import annotations

from typing import Any

import grpc


class ChannelWrapper(grpc.aio.Channel):  # type: ignore[misc]  # grpcio has no type stubs: its classes are Any
    """Every call is the wrapped channel's own; a subclass overrides what it changes."""

    def __init__(self, channel: grpc.aio.Channel) -> None:
        self._channel = channel

    def unary_unary(self, *args: Any, **kwargs: Any) -> Any:
        return self._channel.unary_unary(*args, **kwargs)

    def unary_stream(self, *args: Any, **kwargs: Any) -> Any:
        return self._channel.unary_stream(*args, **kwargs)

    def stream_unary(self, *args: Any, **kwargs: Any) -> Any:
        return self._channel.stream_unary(*args, **kwargs)

    def stream_stream(self, *args: Any, **kwargs: Any) -> Any:
        return self._channel.stream_stream(*args, **kwargs)

    async def close(self, grace: float | None = None) -> None:
        await self._channel.close(grace)

    def get_state(self, try_to_connect: bool = False) -> grpc.ChannelConnectivity:
        return self._channel.get_state(try_to_connect)

    async def wait_for_state_change(self, last_observed_state: grpc.ChannelConnectivity) -> None:
        await self._channel.wait_for_state_change(last_observed_state)

    async def channel_ready(self) -> None:
        await self._channel.channel_ready()

    async def __aenter__(self) -> "ChannelWrapper":
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close(None)
