"""The Python client of BAE, the Better Agent Engine.

    from bae_client import Client, Tool

    clock = Tool("get_current_time", "The current time", handler=lambda _input: "18:26 UTC")
    with Client("http://127.0.0.1:8080", client_key="bae_…") as bae:
        session = bae.open(tools=[clock])
        reply = session.send("What time is it?", on_event=lambda event: print(event.event_type))
        print(reply.text)

`Session.send` is the harness loop: it registers the driver once, streams the turn (live events to
`on_event` and the `on_event` hook), runs the handler of every `dispatch: "client"` tool call, sends the
results back and repeats until the model answers without calling a client tool. `AsyncClient` is the same
with `async`/`await`. docs/reference/client.md is the reference.
"""

from bae_client._protocol import Reply
from bae_client.aio import AsyncClient, AsyncSession, AsyncSubscription
from bae_client.errors import (
    ApiError,
    ApplicationError,
    BaeError,
    BudgetExhaustedError,
    DriverNotRegisteredError,
    HookError,
    InternalError,
    InvalidParamsError,
    InvalidRequestError,
    LaggedError,
    MethodNotFoundError,
    ParseError,
    ProvidersFailedError,
    QuotaExceededError,
    RpcCode,
    RpcError,
    SandboxImageNotAllowedError,
    SandboxNotRunningError,
    SandboxStartFailedError,
    SubagentNotFoundError,
    ToolError,
    ToolNotAllowedError,
    TransportError,
    TurnCancelledError,
    TurnInProgressError,
    UnknownToolError,
)
from bae_client.events import PAYLOAD_TYPES, Delta, Event, EventType
from bae_client.files import FileToolConfig, explore_files_tool, read_file_tool, write_file_tool
from bae_client.hooks import Hooks
from bae_client.sandbox import auto_shell_tool
from bae_client.sync import Client, Session, Subscription
from bae_client.tools import Tool, ToolHandler

__version__ = "0.1.0"

__all__ = [
    "PAYLOAD_TYPES",
    "ApiError",
    "ApplicationError",
    "AsyncClient",
    "AsyncSession",
    "AsyncSubscription",
    "BaeError",
    "BudgetExhaustedError",
    "Client",
    "Delta",
    "DriverNotRegisteredError",
    "Event",
    "EventType",
    "FileToolConfig",
    "HookError",
    "Hooks",
    "InternalError",
    "InvalidParamsError",
    "InvalidRequestError",
    "LaggedError",
    "MethodNotFoundError",
    "ParseError",
    "ProvidersFailedError",
    "QuotaExceededError",
    "Reply",
    "RpcCode",
    "RpcError",
    "SandboxImageNotAllowedError",
    "SandboxNotRunningError",
    "SandboxStartFailedError",
    "Session",
    "SubagentNotFoundError",
    "Subscription",
    "Tool",
    "ToolError",
    "ToolHandler",
    "ToolNotAllowedError",
    "TransportError",
    "TurnCancelledError",
    "TurnInProgressError",
    "UnknownToolError",
    "__version__",
    "auto_shell_tool",
    "explore_files_tool",
    "read_file_tool",
    "write_file_tool",
]
