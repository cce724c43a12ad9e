"""`bae run --demo` with BAE_CONFIG: the demo provider joins the user's config, so the demo model
calls the user's MCP server's tool with the input the user's text gives it."""

from __future__ import annotations

import signal
import subprocess
import sys
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

import pytest

from testkit.live import new_session, register, result, send
from testkit.mcp_support import TOOLS_SERVER
from testkit.ports import free_port
from testkit.stack import StackClients, stack_env

pytestmark = pytest.mark.stack


@dataclass
class DemoRun:
    """`bae run --demo` in the foreground: its banner up to "Press Ctrl-C", clients for its two ports, and
    (once stopped) the rest of its output."""

    clients: StackClients
    banner: list[str]
    output: str = field(default="")


@contextmanager
def bae_run_demo(cwd: Path, env: dict[str, str]) -> Iterator[DemoRun]:
    """Started, and stopped as Ctrl-C would stop it; it must exit 0."""
    process = subprocess.Popen([sys.executable, "-m", "bae", "run", "--demo"], cwd=cwd, env=env,
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        assert process.stdout is not None
        banner = []
        for line in process.stdout:
            banner.append(line)
            if line.startswith("Press Ctrl-C"):
                break
        run = DemoRun(StackClients(f"http://{env['BAE_ADDR']}", f"http://{env['BAE_ADMIN_ADDR']}",
                                   Path(env["BAE_ADMIN_KEY_FILE"]).read_text().strip()), banner)
        try:
            yield run
        finally:
            run.clients.close()
    finally:
        process.send_signal(signal.SIGTERM)
        output, _ = process.communicate(timeout=60)
    assert process.returncode == 0, output
    run.output = output


def test_demo_adds_its_provider_to_the_users_mcp_servers(tmp_path: Path) -> None:
    config = tmp_path / "bae-config.toml"
    config.write_text(f'[[mcp.servers]]\nname = "local"\ntransport = "stdio"\ncommand = "{sys.executable}"\n'
                      f'args = ["{TOOLS_SERVER}", "stdio"]\n')
    env = stack_env(tmp_path, BAE_CONFIG=str(config), BAE_DEMO_PROVIDER_ADDR=f"127.0.0.1:{free_port()}")
    with bae_run_demo(tmp_path, env) as run:
        assert any("DEMO provider" in line for line in run.banner), "".join(run.banner)
        stack = run.clients
        assert [p["name"] for p in stack.admin.get("/admin/v1/providers").json()["items"]] == ["demo"]
        assert stack.admin.get("/admin/v1/mcp-servers").json()["items"] == [{"name": "local", "transport": "stdio"}]
        sid, skey, _ = new_session(stack, (), primary="demo", mcp_servers=["local"])
        register(stack, sid, skey)
        answer = result(send(stack, sid, skey, 'Please echo {"text": "from the demo"}'))
        assert answer["message"]["content"] == [{"type": "text", "text": "[demo] echo returned: from the demo"}]
        dispatched = [e["payload"] for e in answer["events"] if e["event_type"] == "tool.result"]
        assert [(p["dispatch"], p["server_name"]) for p in dispatched] == [("mcp", "local")]
    assert "ignored" not in "".join(run.banner) + run.output


def test_demo_refuses_a_config_it_cannot_join(tmp_path: Path) -> None:
    config = tmp_path / "bae-config.toml"
    config.write_text('[[providers.entries]]\nname = "demo"\nprovider = "openai"\nmodel = "m"\nauth_token = "t"\n')
    env = stack_env(tmp_path, BAE_CONFIG=str(config))
    done = subprocess.run([sys.executable, "-m", "bae", "run", "--demo"], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    assert done.stderr.strip() == (f'error: BAE_CONFIG={config} has a provider named "demo", the name --demo gives '
                                   "its own: rename that entry")


def test_the_demo_model_streams_when_a_client_asks_for_deltas(tmp_path: Path) -> None:
    from bae_client import Client, Tool

    env = stack_env(tmp_path, BAE_DEMO_PROVIDER_ADDR=f"127.0.0.1:{free_port()}")
    with bae_run_demo(tmp_path, env) as run:
        profile = run.clients.create_profile("streamed", primary="demo", allowed_tools=["echo"])
        key = run.clients.create_key(profile["id"])["key"]
        echo = Tool("echo", "Echo its text", {"type": "object"}, handler=lambda tool_input: tool_input["text"])
        with Client(f"http://{env['BAE_ADDR']}", client_key=key) as bae:
            session = bae.open(tools=[echo])
            deltas = []
            reply = session.send("stream these few words", on_delta=deltas.append)
            assert reply.text == "[demo] you said: stream these few words"
            assert "".join(d.text for d in deltas if d.kind == "text") == reply.text
            assert [d.text for d in deltas if d.kind == "text"][:3] == ["[demo] ", "you ", "said: "]
            deltas.clear()
            reply = session.send('echo {"text": "streamed input"}', on_delta=deltas.append)
            assert reply.text == "[demo] echo returned: streamed input"
            assert any(d.kind == "tool_input" for d in deltas)
            session.close()
