"""The no-key first session: `make demo`, the example script, and bae_client."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
from pathlib import Path
from typing import Iterator

import pytest

from bae_client import ApiError, Client, DriverNotRegisteredError, Event, EventType, Tool, UnknownToolError
from testkit import ROOT
from testkit.ports import free_port
from testkit.processes import service_env
from testkit.stack import RunningStack, launch_demo_stack, stack_env

pytestmark = pytest.mark.stack

TIME = Tool("get_current_time", "The current time")


def recipe_process(make_pid: int) -> int:
    """The process `make` started for the target's recipe (one command, which make runs directly)."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            parent = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        if parent == make_pid:
            return int(entry.name)
    raise AssertionError(f"make ({make_pid}) runs no recipe")


def test_make_demo_then_the_first_session_script(tmp_path: Path) -> None:
    env = stack_env(tmp_path, BAE_DEMO_PROVIDER_ADDR=f"127.0.0.1:{free_port()}")
    for inherited in ("MAKEFLAGS", "MFLAGS", "MAKELEVEL"):  # when the suite itself runs under `make test`
        env.pop(inherited, None)
    # The target itself. -o: the venv and the generated code are the ones this test runs in, so a
    # stale stamp must not make it reinstall the venv here; only the demo recipe runs.
    stack = subprocess.Popen(["make", "--no-print-directory", "-o", ".venv/.installed", "-o", "bae/proto/__init__.py",
                              "demo"], cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        assert stack.stdout is not None
        banner = []
        for line in stack.stdout:
            banner.append(line)
            if line.startswith("Press Ctrl-C"):
                break
        assert banner[0] == ".venv/bin/python -m bae run --demo \n", banner[0]  # make echoes the recipe
        assert any("DEMO provider" in line for line in banner), "".join(banner)
        admin_url = f"http://{env['BAE_ADMIN_ADDR']}"
        script = [sys.executable, "examples/first_session.py", "--url", f"http://{env['BAE_ADDR']}",
                  "--admin-url", admin_url, "--admin-key-file", env["BAE_ADMIN_KEY_FILE"]]
        for _ in range(2):  # the second run finds the profile it created
            result = subprocess.run(script, cwd=ROOT, capture_output=True, text=True, timeout=60)
            assert result.returncode == 0, result.stderr
            lines = result.stdout.splitlines()
            assert "model < [demo] you said: Hello, BAE!" in lines
            assert "model < [demo] calling get_current_time" not in lines  # the loop answered the tool call
            assert any(line.startswith("  (client) running get_current_time({}) -> ") for line in lines)
            assert any(line.startswith("model < [demo] get_current_time returned: 20") for line in lines)
            assert "    · tool.call" in lines
    finally:
        # As Ctrl-C would: the stack stops, and make ends with the recipe's exit code.
        if stack.poll() is None:
            os.kill(recipe_process(stack.pid), signal.SIGTERM)
        output, _ = stack.communicate(timeout=30)
    assert stack.returncode == 0, output
    assert (tmp_path / "demo-config.toml").read_text().count("[[providers.entries]]") == 1


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningStack]:
    running = launch_demo_stack(tmp_path_factory.mktemp("demo"))
    yield running
    running.close()


def new_key(demo: RunningStack, tools: list[str]) -> tuple[str, str]:
    profile = demo.create_profile(f"client-{free_port()}", primary="demo", allowed_tools=tools)
    return profile["id"], demo.create_key(profile["id"])["key"]


def test_client_open_send_join_subscribe_close(demo: RunningStack) -> None:
    profile_id, key = new_key(demo, [TIME.name])
    with Client(str(demo.client.base_url), client_key=key) as bae:
        assert bae.meta()["api_versions"] == ["v1"]
        session = bae.open(tools=[TIME], client_version="test/1")
        assert session.profile["id"] == profile_id

        watcher = bae.join(session.id, client_key=demo.create_key(profile_id, name="watcher")["key"])
        seen: list[str] = []
        with watcher.subscribe() as subscription:
            assert subscription.subscribed

            def watch() -> None:
                for event in subscription:
                    assert isinstance(event, Event)
                    seen.append(event.event_type)

            thread = threading.Thread(target=watch)
            thread.start()
            live: list[str] = []
            reply = session.send("hi there", on_event=lambda event: live.append(event.event_type))
            assert reply.text == "[demo] you said: hi there" and reply.client_tool_calls == []
            assert "provider.response" in live and "client.message.send" not in live  # no echo of our own input
            assert reply.events[0].event_type is EventType.CLIENT_MESSAGE_SEND

            calls: list[dict] = []
            session.tools[TIME.name] = Tool(TIME.name, handler=lambda args: calls.append(args) or "12:00")
            reply = session.send("now call get_current_time")
            assert calls == [{}] and reply.text == "[demo] get_current_time returned: 12:00"
            assert session.drivers() == [reply.events[0].client_key_id]

            del session.tools[TIME.name]
            with pytest.raises(UnknownToolError):  # as upstream bae_py: a call nobody can answer stops the loop
                session.send("get_current_time again, no handler this time")
            # The turn waits for the result: answered by hand.
            call = [event for event in session.all_events() if event.event_type == EventType.TOOL_CALL][-1]
            answered = session.send_message([{"type": "tool_result", "tool_use_id": call.payload["id"],
                                              "content": "no clock here", "is_error": True}])
            assert answered.text == "[demo] get_current_time returned: no clock here"

            watcher.unsubscribe()
            thread.join(30)
        # Subscribed before the first turn: nothing of it is missed.
        assert seen[:3] == ["session.driver.register", "client.message.send", "provider.request"], seen
        history = list(session.all_events())
        assert [event.event_type for event in history].count("tool.result") == 2

        paused = session.send_message("call get_current_time, then never mind")
        assert paused.client_tool_calls and session.cancel_turn() is True
        assert session.cancel_turn() is False
        assert list(session.all_events())[-1].event_type == "session.turn.cancelled"
        assert session.close() == {"session_id": session.id, "state": "closed"}


def test_client_errors(demo: RunningStack) -> None:
    _, key = new_key(demo, [])
    with Client(str(demo.client.base_url)) as bae:
        with pytest.raises(ApiError) as refused:
            bae.open(client_key="bae_" + "0" * 48)
        assert (refused.value.status, refused.value.type) == (401, "unauthorized")
        with pytest.raises(ApiError) as not_allowed:
            bae.open(client_key=key, tools=[TIME])
        assert not_allowed.value.type == "tool_not_allowed"
        session = bae.open(client_key=key)
        with pytest.raises(DriverNotRegisteredError) as unregistered:
            session.call("session.sendMessage", {"message": {"content": "x"}})
        assert unregistered.value.code == -32001
        session.close()
        with pytest.raises(ApiError) as closed:
            session.close()
        assert closed.value.type == "session_closed"


def demo_answer(demo: RunningStack, head: str, parts: Iterator[bytes]) -> bytes:
    """The status line the demo provider answers a POST /v1/messages with `head` and body `parts`,
    sent until it answers (a provider that reads the whole body first never would)."""
    address = demo.settings.demo_provider_addr
    assert address is not None
    with socket.create_connection((address.host, address.port), timeout=30) as sock:
        sock.sendall(f"POST /v1/messages HTTP/1.1\r\nHost: demo\r\nContent-Type: application/json\r\n{head}\r\n"
                     .encode())
        try:
            for part in parts:
                sock.sendall(part)
        except (BrokenPipeError, ConnectionResetError):
            pass  # it answered and closed before the rest
        return sock.makefile("rb").readline()


def test_the_demo_provider_refuses_a_large_body_without_reading_it(demo: RunningStack) -> None:
    mib = b" " * (1024 * 1024)
    # Announced: 300 MB, of which 1 MiB is sent.
    assert demo_answer(demo, f"Content-Length: {300 * 1024 * 1024}\r\n", iter([mib])).startswith(b"HTTP/1.1 413")
    # Unannounced: chunks, cut once over 16 MiB, while the client would send more.
    chunk = b"%x\r\n" % len(mib) + mib + b"\r\n"
    assert demo_answer(demo, "Transfer-Encoding: chunked\r\n", iter([chunk] * 300)).startswith(b"HTTP/1.1 413")


def test_a_demo_provider_address_that_is_not_loopback_is_refused_at_start() -> None:
    env = service_env(BAE_DEMO_PROVIDER_ADDR="0.0.0.0:8089", BAE_RUNNER_GRPC_ADDR=f"127.0.0.1:{free_port()}")
    result = subprocess.run([sys.executable, "-m", "bae.services.runner"], cwd=ROOT, env=env, capture_output=True,
                            text=True, timeout=120)
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        "error: BAE_DEMO_PROVIDER_ADDR: 0.0.0.0:8089 is not a loopback address; the demo provider answers anyone "
        "who reaches it, so it binds to localhost only (e.g. 127.0.0.1:8089)"
    ]
