"""Capped command output: what is kept, what is counted, where a cut stream ends, and its host setting."""

from __future__ import annotations

import pytest

from bae.common.errors import UsageError
from bae.common.settings import load_settings
from bae.services.sandbox.config import load_sandbox_config
from bae.common.truncation import utf8_prefix
from bae.services.sandbox.output import CappedOutput

pytestmark = pytest.mark.unit


@pytest.mark.parametrize(
    ("data", "kept"),
    [
        (b"abc", b"abc"),
        (b"", b""),
        ("aé".encode(), "aé".encode()),
        ("aé".encode()[:2], b"a"),  # the lead byte of a two-byte sequence
        ("a€".encode()[:3], b"a"),  # two bytes of a three-byte sequence
        ("a😀".encode()[:4], b"a"),  # three bytes of a four-byte sequence
        ("a😀".encode(), "a😀".encode()),
        (b"a\x80", b"a\x80"),  # a stray continuation byte is not a cut sequence: kept, replaced on decoding
    ],
)
def test_utf8_prefix_drops_only_a_sequence_cut_short(data: bytes, kept: bytes) -> None:
    assert utf8_prefix(data) == kept


def test_capped_output_keeps_the_head_and_counts_the_rest() -> None:
    output = CappedOutput(limit=5)
    for chunk in (b"abc", b"def", b"ghij"):
        output.append(chunk)
    assert (output.read(), output.read(3), output.read(9), output.truncated) == (b"abcde", b"de", b"", True)
    assert output.text() == "abcde\n[output truncated: 5 bytes omitted]\n"


def test_capped_output_at_exactly_the_limit_is_whole() -> None:
    output = CappedOutput(limit=4)
    output.append("éé".encode())
    assert (output.truncated, output.text()) == (False, "éé")
    output.append(b"!")
    assert output.text() == "éé\n[output truncated: 1 byte omitted]\n"


def test_the_host_output_limit_setting() -> None:
    settings = load_settings({})
    env = {"BAE_SANDBOX_LISTEN_ADDR": "127.0.0.1:50053"}
    assert load_sandbox_config(settings, env).output_limit == 1048576
    assert load_sandbox_config(settings, {**env, "BAE_SANDBOX_OUTPUT_LIMIT": " 4096 "}).output_limit == 4096
    for value, message in (
        ("0", 'BAE_SANDBOX_OUTPUT_LIMIT: "0" is not a positive number'),
        ("1.5", 'BAE_SANDBOX_OUTPUT_LIMIT: "1.5" is not a positive number'),
        ("16777217", 'BAE_SANDBOX_OUTPUT_LIMIT: "16777217" is more than 16777216 bytes (16 MiB)'),
    ):
        with pytest.raises(UsageError) as caught:
            load_sandbox_config(settings, {**env, "BAE_SANDBOX_OUTPUT_LIMIT": value})
        assert str(caught.value) == message


def test_the_host_warm_setting() -> None:
    settings = load_settings({})
    env = {"BAE_SANDBOX_LISTEN_ADDR": "127.0.0.1:50053"}
    assert load_sandbox_config(settings, env).warm == 0
    assert load_sandbox_config(settings, {**env, "BAE_SANDBOX_WARM": " 2 "}).warm == 2
    assert load_sandbox_config(settings, {**env, "BAE_SANDBOX_WARM": "32"}).warm == 32
    for value in ("-1", "33", "two", "1.5"):
        with pytest.raises(UsageError) as caught:
            load_sandbox_config(settings, {**env, "BAE_SANDBOX_WARM": value})
        assert str(caught.value) == f'BAE_SANDBOX_WARM: "{value}" is not a whole number from 0 to 32'


def test_the_host_resident_shell_setting() -> None:
    settings = load_settings({})
    env = {"BAE_SANDBOX_LISTEN_ADDR": "127.0.0.1:50053"}
    assert load_sandbox_config(settings, env).resident_shell is True
    for value, on in (("0", False), (" false ", False), ("TRUE", True), ("1", True)):
        assert load_sandbox_config(settings, {**env, "BAE_SANDBOX_RESIDENT_RUNNER": value}).resident_shell is on
    with pytest.raises(UsageError) as caught:
        load_sandbox_config(settings, {**env, "BAE_SANDBOX_RESIDENT_RUNNER": "yes"})
    assert str(caught.value) == 'BAE_SANDBOX_RESIDENT_RUNNER: "yes" is not one of 1, true, 0, false'


def test_the_host_network_setting_refuses_the_hosts_and_another_containers() -> None:
    settings = load_settings({})
    env = {"BAE_SANDBOX_LISTEN_ADDR": "127.0.0.1:50053"}
    assert load_sandbox_config(settings, env).network == "bridge"
    for network in ("none", "bae-sandboxes"):
        assert load_sandbox_config(settings, {**env, "BAE_SANDBOX_NETWORK": network}).network == network
    choices = ('use "bridge", "none" (no network), or the name of a Docker network '
               "(e.g. one made with `docker network create --internal`)")
    for network, why in (("host", "would give sandboxes the host's network, its loopback services included"),
                         (" HOST ", "would give sandboxes the host's network, its loopback services included"),
                         ("container:bae-session-1", "would put sandboxes in another container's network")):
        with pytest.raises(UsageError) as caught:
            load_sandbox_config(settings, {**env, "BAE_SANDBOX_NETWORK": network})
        assert str(caught.value) == f'BAE_SANDBOX_NETWORK: "{network.strip()}" {why}; {choices}'
