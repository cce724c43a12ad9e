"""The effective provider history of a session (SERVER-SPEC §12.5), kept in memory.

Built once from the log's message events, then extended as events are
published, so a turn never re-reads the whole log. A compaction marker moves
the start of the history to its preamble. Each message is kept as JSON text
too, made once: a provider step gets the texts and their roles, never a
re-serialization (and the runner reads only the messages it must change).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

from bae.jsontext import dump

MESSAGE_EVENTS = ("client.message.send", "server.message.send")
DEFAULT_ROLE = {"client.message.send": "user", "server.message.send": "assistant"}


class StepMessages(NamedTuple):
    """A provider step's history: each message's JSON text, and its role."""

    texts: list[str]
    roles: list[str]


class History:
    def __init__(self) -> None:
        self._entries: list[tuple[str, dict, str]] = []  # (event id, {role, content}, its JSON text)

    @classmethod
    def from_events(cls, events: Sequence[dict]) -> "History":
        history = cls()
        history.observe(events)
        return history

    def observe(self, events: Sequence[dict]) -> None:
        for event in events:
            kind = event["event_type"]
            payload = event["payload"]
            if kind in MESSAGE_EVENTS:
                role = payload.get("role") or DEFAULT_ROLE[kind]
                message = {"role": role, "content": payload.get("content")}
                self._entries.append((event["id"], message, dump(message)))
            elif kind == "session.compaction.completed":
                self._restart_at(payload.get("preamble_event_id"), payload.get("summary_event_id"))

    def _restart_at(self, *candidates: str | None) -> None:
        for event_id in candidates:
            for index, (entry_id, _, _) in enumerate(self._entries):
                if entry_id == event_id:
                    del self._entries[:index]
                    return

    def __len__(self) -> int:
        return len(self._entries)

    def with_instruction(self, instruction: str) -> StepMessages:
        """The history plus a compaction instruction as the last user turn (§12.4 step 5): a text
        block appended to a last user message, else a user message whose content is the instruction."""
        if self._entries and self._entries[-1][1]["role"] == "user":
            last = self._entries[-1][1]
            content = last["content"]
            blocks = [{"type": "text", "text": content}] if isinstance(content, str) else list(content or [])
            return self._with(self._entries[:-1], [{**last, "content": [*blocks, {"type": "text", "text": instruction}]}])
        return self._with(self._entries, [{"role": "user", "content": instruction}])

    def step_messages(self, extensions: Sequence[dict] = ()) -> StepMessages:
        """The history, then `extensions` (this turn's messages not yet logged)."""
        return self._with(self._entries, extensions)

    @staticmethod
    def _with(entries: Sequence[tuple[str, dict, str]], tail: Sequence[dict]) -> StepMessages:
        return StepMessages(
            [text for _, _, text in entries] + [dump(message) for message in tail],
            [message["role"] for _, message, _ in entries] + [message["role"] for message in tail],
        )
