"""The shared stream writer: what queued during a write goes out packed, in order, within its bound."""

from __future__ import annotations

import asyncio

import pytest

from bae.common.protos import runner_pb2
from bae.common.stream_writer import PACK_BYTES, StreamWriter

pytestmark = pytest.mark.unit


class HeldStream:
    """A write target that records each packed message and holds a write until released."""

    def __init__(self) -> None:
        self.written: list[runner_pb2.StepCalls] = []
        self.release = asyncio.Event()
        self.release.set()
        self.writing = asyncio.Event()

    async def write(self, pack: runner_pb2.StepCalls) -> None:
        self.writing.set()
        await self.release.wait()
        self.written.append(pack)


def call(call_id: int, size: int = 0) -> runner_pb2.StepCall:
    return runner_pb2.StepCall(step_id=call_id, start=runner_pb2.StepStart(
        request=runner_pb2.StepRequest(session_id="x" * size)))


def writer_to(stream: HeldStream, failures: list[Exception]) -> StreamWriter[runner_pb2.StepCall]:
    return StreamWriter(stream.write, failures.append, runner_pb2.StepCalls)


def ids(stream: HeldStream) -> list[list[int]]:
    return [[c.step_id for c in pack.calls] for pack in stream.written]


async def test_messages_queued_during_a_write_go_out_as_one_pack_in_order() -> None:
    stream, failures = HeldStream(), []
    writer = writer_to(stream, failures)
    stream.release.clear()
    writer.send(call(1))
    await stream.writing.wait()  # the first write is in flight: the next ones queue behind it
    for call_id in range(2, 6):
        writer.send(call(call_id))
    stream.release.set()
    await writer.flush()
    assert ids(stream) == [[1], [2, 3, 4, 5]]
    await writer.close()
    assert not failures


async def test_a_pack_stays_within_its_bound_and_a_large_message_goes_alone() -> None:
    stream, failures = HeldStream(), []
    writer = writer_to(stream, failures)
    stream.release.clear()
    writer.send(call(1))
    await stream.writing.wait()
    third = PACK_BYTES // 3
    for call_id, size in ((2, third), (3, third), (4, third), (5, PACK_BYTES * 2), (6, 10)):
        writer.send(call(call_id, size))
    stream.release.set()
    await writer.flush()
    # 2 and 3 fit together; 4 would cross the bound and starts the next pack; 5 is over it alone.
    assert ids(stream) == [[1], [2, 3], [4], [5], [6]]
    assert all(pack.ByteSize() <= PACK_BYTES + 64 for pack in stream.written if len(pack.calls) > 1)
    await writer.close()


async def test_a_failed_write_stops_the_writer_and_flush_returns() -> None:
    failures: list[Exception] = []

    async def broken(_: object) -> None:
        raise RuntimeError("the call ended")

    writer: StreamWriter[runner_pb2.StepCall] = StreamWriter(
        broken, failures.append, runner_pb2.StepCalls
    )
    writer.send(call(1))
    writer.send(call(2))
    await asyncio.wait_for(writer.flush(), 5)
    assert [str(failure) for failure in failures] == ["the call ended"]
    await writer.close()
