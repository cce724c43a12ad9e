"""A small typed Python client for the client API (REST + JSON-RPC over NDJSON).

    from bae.client import Client

    with Client("http://127.0.0.1:8080") as bae:
        session = bae.open(client_key, tools=[ToolDef("get_time", "The current time")])
        reply = session.send("What time is it?", handlers={"get_time": lambda args: "12:00"})
        print(reply.text)

`Session.send` is the harness loop of the client API reference: it registers
the driver once, streams the turn (each live event goes to `on_event`), runs
the handler of every `dispatch:"client"` tool call, sends the results back and
repeats until the assistant answers without calling one of your tools.
"""

from bae.client.client import Client, ToolDef
from bae.client.errors import ApiError, RpcCode, RpcError
from bae.client.session import NDJSON, Delta, DeltaHandler, Event, EventHandler, Reply, Session, ToolHandler

__all__ = [
    "NDJSON",
    "ApiError",
    "Client",
    "Delta",
    "DeltaHandler",
    "Event",
    "EventHandler",
    "Reply",
    "RpcCode",
    "RpcError",
    "Session",
    "ToolDef",
    "ToolHandler",
]
