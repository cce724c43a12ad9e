"""bae_client's remote sandbox helpers against a stack with sandbox hosts and Docker: a shell tool the
server runs itself (Auto, `auto_shell_tool`), and one the client runs through `exec_remote_sandbox`
(Manual, `remote_shell_tool`), sync and async."""

from __future__ import annotations

import json
import time
import uuid
from typing import Iterator

import pytest

from bae_client import AsyncClient, Client, EventType, SandboxNotRunningError, Tool, auto_shell_tool
from testkit.docker_support import TEST_IMAGE, require_docker, stack_with_sandbox_hosts
from testkit.mockllm import MockLLM, Reply
from testkit.stack import RunningStack

pytestmark = [pytest.mark.stack, pytest.mark.docker]

RUN = f"test-client-sandbox-{uuid.uuid4().hex[:8]}"


@pytest.fixture(scope="module")
def running(mock: MockLLM, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningStack]:
    require_docker()
    with stack_with_sandbox_hosts(tmp_path_factory.mktemp("client-sandbox"), mock.base_url, RUN,
                                  MOCK_LLM_TOKEN="t0ken-for-tests", BAE_SANDBOX_HOST_ID=f"{RUN}-0") as stack:
        yield stack


@pytest.fixture
def stack(running: RunningStack, mock: MockLLM) -> RunningStack:
    mock.reset()
    return running


def new_key(stack: RunningStack, tools: list[str]) -> str:
    profile = stack.create_profile(f"p{time.monotonic_ns()}", allowed_tools=tools, available_sandboxes=[TEST_IMAGE])
    return str(stack.create_key(profile["id"])["key"])


def test_manual_a_client_tool_runs_the_command_in_the_remote_sandbox(stack: RunningStack, mock: MockLLM) -> None:
    with Client(stack.client_url, client_key=new_key(stack, ["run_shell_command"])) as bae:
        session = bae.open(tools=[Tool("run_shell_command")])
        session.tools["run_shell_command"] = session.remote_shell_tool()
        with pytest.raises(SandboxNotRunningError):
            session.exec_remote_sandbox("true")
        started = session.start_remote_sandbox(TEST_IMAGE)
        assert started["image"] == TEST_IMAGE
        mock.enqueue(Reply.tool_use([("tu_1", "run_shell_command", {"command": "echo hi; exit 3"})]),
                     Reply.text("done"))
        assert session.send("run it").text == "done"
        sent = mock.requests[-1]["body"]["messages"][-1]["content"][0]
        assert json.loads(sent["content"]) == {"stdout": "hi\n", "stderr": "", "exit_code": 3}
        assert session.stop_remote_sandbox()["stopped"] is True
        session.close()


async def test_auto_the_server_runs_the_shell_tool(stack: RunningStack, mock: MockLLM) -> None:
    async with AsyncClient(stack.client_url, client_key=new_key(stack, [])) as bae:
        session = await bae.open(sandbox_tools=[auto_shell_tool("sh")])
        await session.start_remote_sandbox(TEST_IMAGE)
        mock.enqueue(Reply.tool_use([("tu_1", "sh", {"command": "echo auto"})]), Reply.text("ok"))
        reply = await session.send("run it")
        assert reply.text == "ok"
        kinds = [event.event_type for event in reply.events]
        assert EventType.SANDBOX_REQUEST in kinds and EventType.SANDBOX_RESPONSE in kinds
        ran = await session.exec_remote_sandbox("echo direct")
        assert ran == {"stdout": "direct\n", "stderr": "", "exit_code": 0}
        await session.close()  # stops the sandbox too
