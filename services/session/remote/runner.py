"""The session service's connection to the runner."""

from __future__ import annotations

import asyncio
from typing import AsyncGenerator

import grpc

from bae import grpcutil
from bae.internal import InternalPlane
from bae.protos import runner_pb2_grpc


class RunnerClient:
    """The runner stub, except that a step first waits (up to `connect_timeout`) for the channel.

    After the runner restarts, the channel sits in reconnect backoff for a moment and
    a plain call would fail at once; a runner that stays down still fails the step.
    """

    def __init__(self, address: str, connect_timeout: float, plane: InternalPlane) -> None:
        self.channel = grpcutil.channel(address, plane)
        self.stub = runner_pb2_grpc.RunnerStub(self.channel)
        self.connect_timeout = connect_timeout

    async def RunStep(self, request, *, timeout: float) -> AsyncGenerator:
        if self.channel.get_state(try_to_connect=True) != grpc.ChannelConnectivity.READY:
            try:
                await asyncio.wait_for(self.channel.channel_ready(), self.connect_timeout)
            except TimeoutError:
                pass  # the call below fails fast with UNAVAILABLE
        call = self.stub.RunStep(request, timeout=timeout)
        try:
            async for update in call:
                yield update
        finally:
            call.cancel()  # a consumer that stops early must not leave the step running
