"""The effective provider history of a session (SERVER-SPEC §12.5), kept in memory.

Built once from the log's message events, then extended as events are
published, so a turn never re-reads the whole log. A compaction marker moves
the start of the history to its preamble. Each message is kept as JSON text
too, made once: a provider step gets the texts and their roles, never a
re-serialization (and the runner reads only the messages it must change).
"""

from __future__ import annotations

from collections.abc import Sequence

from bae.common.jsontext import JsonObject, dump, load
from bae.services.session.engine.ports import StepMessages

MESSAGE_EVENTS = ("client.message.send", "server.message.send")
DEFAULT_ROLE = {"client.message.send": "user", "server.message.send": "assistant"}


class History:
    """Parallel lists, one item per message: a step copies the texts and roles as they are."""

    def __init__(self) -> None:
        self._ids: list[str] = []  # the message's event id
        self._texts: list[str] = []  # its JSON text: {role, content}
        self._roles: list[str] = []

    @classmethod
    def from_events(cls, events: Sequence[JsonObject]) -> "History":
        history = cls()
        history.observe(events)
        return history

    def observe(self, events: Sequence[JsonObject]) -> None:
        for event in events:
            kind = event["event_type"]
            payload = event["payload"]
            if kind in MESSAGE_EVENTS:
                role = payload.get("role") or DEFAULT_ROLE[kind]
                message = {"role": role, "content": payload.get("content")}
                self._ids.append(event["id"])
                self._texts.append(dump(message))
                self._roles.append(role)
            elif kind == "session.compaction.completed":
                self._restart_at(payload.get("preamble_event_id"), payload.get("summary_event_id"))

    def _restart_at(self, *candidates: str | None) -> None:
        for event_id in candidates:
            if event_id in self._ids:
                index = self._ids.index(event_id)
                for items in (self._ids, self._texts, self._roles):
                    del items[:index]
                return

    def __len__(self) -> int:
        return len(self._ids)

    def with_instruction(self, instruction: str) -> StepMessages:
        """The history plus a compaction instruction as the last user turn (§12.4 step 5): a text
        block appended to a last user message, else a user message whose content is the instruction."""
        if self._roles and self._roles[-1] == "user":
            last = load(self._texts[-1])
            content = last["content"]
            blocks = [{"type": "text", "text": content}] if isinstance(content, str) else list(content or [])
            instructed = {**last, "content": [*blocks, {"type": "text", "text": instruction}]}
            return StepMessages(self._texts[:-1] + [dump(instructed)], list(self._roles))
        return self.step_messages([{"role": "user", "content": instruction}])

    def step_messages(self, extensions: Sequence[JsonObject] = ()) -> StepMessages:
        """The history, then `extensions` (this turn's messages not yet logged)."""
        return StepMessages(
            self._texts + [dump(message) for message in extensions],
            self._roles + [message["role"] for message in extensions],
        )
