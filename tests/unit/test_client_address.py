"""The access line's client address (bae/services/gateway/observe.py): the socket's peer, or behind
trusted proxies the rightmost untrusted X-Forwarded-For entry, read within bounds."""

from __future__ import annotations

from typing import Any

import pytest

from bae.common.settings import parse_trusted_proxies
from bae.services.gateway.observe import MAX_FORWARDED_HOPS, client_address

pytestmark = pytest.mark.unit

TRUSTED = parse_trusted_proxies("10.0.0.0/8,127.0.0.1")


def scope(peer: tuple[str, int] | None, *forwarded: bytes) -> dict[str, Any]:
    return {"client": peer, "headers": [(b"host", b"x"), *((b"x-forwarded-for", value) for value in forwarded)]}


@pytest.mark.parametrize("peer, forwarded, expected", [
    (("203.0.113.1", 1), [b"198.51.100.1"], "203.0.113.1"),  # an untrusted peer: the header is not read
    (("10.0.0.1", 1), [], "10.0.0.1"),
    (("10.0.0.1", 1), [b"198.51.100.1, 203.0.113.9, 10.1.1.1"], "203.0.113.9"),
    (("10.0.0.1", 1), [b"198.51.100.1", b"10.2.2.2"], "198.51.100.1"),  # several headers are one list
    (("10.0.0.1", 1), [b"10.9.9.9,10.8.8.8"], "10.9.9.9"),  # all trusted: the leftmost
    (("10.0.0.1", 1), [b"203.0.113.9, unknown, 10.3.3.3"], "10.3.3.3"),  # no address: the last hop known
    (("10.0.0.1", 1), [b"[2001:db8::1]:443"], "10.0.0.1"),
    (("::ffff:10.0.0.1", 1), [b"203.0.113.9"], "203.0.113.9"),  # an IPv4-mapped peer is its IPv4 address
    (None, [b"203.0.113.9"], "-"),
])
def test_client_address(peer: tuple[str, int] | None, forwarded: list[bytes], expected: str) -> None:
    assert client_address(scope(peer, *forwarded), TRUSTED) == expected


def test_no_trusted_proxies_means_the_header_is_never_read() -> None:
    assert client_address(scope(("127.0.0.1", 5), b"203.0.113.9"), ()) == "127.0.0.1"


def test_a_long_header_is_read_from_its_tail_only() -> None:
    chain = b", ".join([b"203.0.113.9"] + [b"10.0.0.7"] * 10_000)
    # Past MAX_FORWARDED_HOPS trusted entries the walk stops at the last one it read.
    assert client_address(scope(("10.0.0.1", 1), chain), TRUSTED) == "10.0.0.7"
    short = b", ".join([b"203.0.113.9"] + [b"10.0.0.7"] * (MAX_FORWARDED_HOPS - 1))
    assert client_address(scope(("10.0.0.1", 1), short), TRUSTED) == "203.0.113.9"
    huge = b"1" * 1_000_000 + b", 10.0.0.7"
    assert client_address(scope(("10.0.0.1", 1), huge), TRUSTED) == "10.0.0.7"
