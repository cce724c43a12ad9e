"""Client tools: the declaration sent at open or join, with the handler that answers the model's calls."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

# input -> result: a str, a list of content blocks, or anything JSON-serialisable (sent as its JSON text).
# An async handler (a coroutine function) is for AsyncSession; Session runs sync handlers only.
ToolHandler = Callable[[dict[str, Any]], Any]


@dataclass(frozen=True)
class Tool:
    """A tool the client runs for the model. `name`, `description` and `input_schema` are declared to the
    server (the profile's `allowed_tools` must list the name); `handler` answers each call of it.
    A tool without a handler can be declared, but a call of it stops `send` with UnknownToolError."""

    name: str
    description: str = ""
    input_schema: dict[str, Any] = field(default_factory=lambda: {"type": "object"})
    handler: ToolHandler | None = field(default=None, compare=False)

    def declaration(self) -> dict[str, Any]:
        """The `{name, description, input_schema}` sent at open, join and updateClientTools."""
        return {"name": self.name, "description": self.description, "input_schema": self.input_schema}

    @staticmethod
    def define(description: str = "", input_schema: dict[str, Any] | None = None,
               name: str | None = None) -> Callable[[ToolHandler], Tool]:
        """A decorator making a Tool of a function, named after it:

            @Tool.define(description="The current time")
            def get_current_time(input: dict) -> str: ...
        """

        def wrap(handler: ToolHandler) -> Tool:
            return Tool(name or handler.__name__, description or (handler.__doc__ or "").strip(),
                        input_schema if input_schema is not None else {"type": "object"}, handler)

        return wrap
