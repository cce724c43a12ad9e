"""The effective provider history of a session (SERVER-SPEC §12.5), kept in memory.

Built once from the log's message events, then extended as events are
published, so a turn never re-reads the whole log. A compaction marker moves
the start of the history to its preamble.
"""

from __future__ import annotations

MESSAGE_EVENTS = ("client.message.send", "server.message.send")
DEFAULT_ROLE = {"client.message.send": "user", "server.message.send": "assistant"}


class History:
    def __init__(self) -> None:
        self._entries: list[tuple[str, dict]] = []  # (event id, {role, content})

    @classmethod
    def from_events(cls, events: list[dict]) -> "History":
        history = cls()
        history.observe(events)
        return history

    def observe(self, events: list[dict]) -> None:
        for event in events:
            kind = event["event_type"]
            payload = event["payload"]
            if kind in MESSAGE_EVENTS:
                role = payload.get("role") or DEFAULT_ROLE[kind]
                self._entries.append((event["id"], {"role": role, "content": payload.get("content")}))
            elif kind == "session.compaction.completed":
                self._restart_at(payload.get("preamble_event_id"), payload.get("summary_event_id"))

    def _restart_at(self, *candidates: str | None) -> None:
        for event_id in candidates:
            for index, (entry_id, _) in enumerate(self._entries):
                if entry_id == event_id:
                    del self._entries[:index]
                    return

    @property
    def messages(self) -> list[dict]:
        return [message for _, message in self._entries]

    def __len__(self) -> int:
        return len(self._entries)

    def last_assistant(self) -> dict | None:
        for _, message in reversed(self._entries):
            if message["role"] == "assistant":
                return message
        return None
