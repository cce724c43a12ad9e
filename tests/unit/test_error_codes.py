"""The internal plane's error table: every kind crosses a gRPC call and comes back the same."""

from __future__ import annotations

import grpc
import pytest

from bae.common import error_codes, errors

pytestmark = pytest.mark.unit


def failed_call(error: errors.BaeError) -> grpc.aio.AioRpcError:
    """What a client sees of a call the server ended with `error_codes.abort(error)`."""
    return grpc.aio.AioRpcError(
        error_codes.code_of(error), grpc.aio.Metadata(), grpc.aio.Metadata(error_codes.trailer(error)), error.detail
    )


@pytest.mark.parametrize("kind", list(error_codes.CODES))
def test_every_kind_comes_back_as_itself(kind: type[errors.BaeError]) -> None:
    sent = kind("the detail", reason="a_reason", retry_after=7)
    received = error_codes.raised_by(failed_call(sent))
    assert type(received) is kind
    assert (received.reason, received.detail, received.retry_after) == ("a_reason", "the detail", 7)


def test_each_kind_has_its_own_code() -> None:
    assert len(set(error_codes.CODES.values())) == len(error_codes.CODES)


def test_a_subclass_travels_as_its_kind_with_its_default_reason() -> None:
    class SessionClosed(errors.Conflict):
        default_reason = "session_closed"

    received = error_codes.raised_by(failed_call(SessionClosed("session is already closed")))
    assert type(received) is errors.Conflict and received.reason == "session_closed"


def test_no_trailer_is_no_error_of_ours() -> None:
    plain = grpc.aio.AioRpcError(grpc.StatusCode.UNAVAILABLE, grpc.aio.Metadata(), grpc.aio.Metadata(), "down")
    assert error_codes.raised_by(plain) is None


def test_details_are_bounded() -> None:
    assert len(errors.Internal("x" * 10_000).detail) == errors.DETAIL_LIMIT + 1
