"""Resuming a paused turn: the merge rules of SERVER-SPEC §7.4, as pure functions."""

from __future__ import annotations

from typing import Any

from bae.common.errors import echo
from bae.common.jsontext import JsonObject

ABANDONED_TEXT = "Client tool call was abandoned before returning a result."


class MergeInvalid(Exception):
    """The continuation does not answer the paused turn; `str(exc)` is the detail."""


def has_tool_result(content: object) -> bool:
    return isinstance(content, list) and any(
        isinstance(block, dict) and block.get("type") == "tool_result" for block in content
    )


def is_continuation(content: object) -> bool:
    """An owner continuation carries tool results (or is empty); anything else abandons."""
    return has_tool_result(content) or content == "" or content == []


def _paused_ids(tool_uses: list[JsonObject]) -> list[Any]:
    ids = [block.get("id") for block in tool_uses]
    if not ids:
        raise MergeInvalid("paused assistant turn has no tool_use ids")
    if len(set(ids)) != len(ids):
        raise MergeInvalid("paused assistant turn contains duplicate tool_use ids")
    return ids


def _checked_server_results(server_results: dict[str, JsonObject]) -> dict[str, JsonObject]:
    checked: dict[str, JsonObject] = {}
    for block in server_results.values():
        tool_use_id = block.get("tool_use_id")
        if not isinstance(tool_use_id, str):
            raise MergeInvalid("server tool_result is missing a string tool_use_id")
        if tool_use_id in checked:
            raise MergeInvalid(f'server produced a duplicate tool_result for id "{echo(str(tool_use_id))}"')
        checked[tool_use_id] = block
    return checked


def merge_continuation(tool_uses: list[JsonObject], server_results: dict[str, JsonObject], content: object) -> list[Any]:
    """The owner's tool results merged with the stashed server results (server copies win)."""
    ids = _paused_ids(tool_uses)
    server = _checked_server_results(server_results)
    client: dict[Any, JsonObject] = {}
    rest: list[Any] = []
    for block in content if isinstance(content, list) else []:
        if isinstance(block, dict) and block.get("type") == "tool_result":
            tool_use_id = block.get("tool_use_id")
            if tool_use_id in client:
                raise MergeInvalid(f'client returned a duplicate tool_result for id "{echo(str(tool_use_id))}"')
            if tool_use_id not in ids:
                raise MergeInvalid(f'tool_result id "{echo(str(tool_use_id))}" is not in the paused assistant turn')
            client[tool_use_id] = block
        else:
            rest.append(block)
    merged = []
    for tool_use_id in ids:
        block = server.get(tool_use_id) or client.get(tool_use_id)
        if block is None:
            raise MergeInvalid(f'no tool_result for tool_use id "{echo(str(tool_use_id))}"')
        merged.append(block)
    return merged + rest


def error_result(tool_use_id: str, text: str = ABANDONED_TEXT) -> JsonObject:
    return {"type": "tool_result", "tool_use_id": tool_use_id, "content": text, "is_error": True}


def synthesize(
    tool_uses: list[JsonObject], server_results: dict[str, JsonObject], text: str = ABANDONED_TEXT
) -> list[JsonObject]:
    """Server results plus a synthetic error result saying `text` for every unanswered id, in tool_use order."""
    ids = _paused_ids(tool_uses)
    server = _checked_server_results(server_results)
    return [server.get(tool_use_id) or error_result(tool_use_id, text) for tool_use_id in ids]


def merge_abandonment(
    tool_uses: list[JsonObject], server_results: dict[str, JsonObject], content: object, *, timed_out: bool
) -> list[Any]:
    """Abandon the pending client calls and append the new message's content."""
    if timed_out and has_tool_result(content):
        raise MergeInvalid("timed-out replacement message must not contain tool_result blocks")
    if isinstance(content, str):
        extra = [{"type": "text", "text": content}]
    elif isinstance(content, list):
        extra = list(content)
    else:
        raise MergeInvalid("abandonment message content must be a string or content-block array")
    return synthesize(tool_uses, server_results) + extra
