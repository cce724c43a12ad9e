"""Hooks into the harness loop (`send`), as upstream bae_py has them.

Order within one `send`: for each round, `before_send(message)`, then `on_event(event)` for each live event
as it arrives, then `after_receive(assistant_message)`; then for each client tool call,
`before_tool_call(tool_use_block)`, the handler, `after_tool_call(tool_result_block)`; then the next round.
A hook may change the dict it gets in place (e.g. rewrite a result's `content` before it is sent). A hook
that raises stops the loop with HookError. For AsyncSession a hook may also be a coroutine function.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable

if TYPE_CHECKING:
    from bae_client.events import Event

Hook = Callable[[dict[str, Any]], Any]


@dataclass
class Hooks:
    before_send: Hook | None = None
    after_receive: Hook | None = None
    before_tool_call: Hook | None = None
    after_tool_call: Hook | None = None
    on_event: Callable[[Event], Any] | None = None
