"""Built-in file tools: `read_file`, `write_file` and `explore_files`, confined to the directories and
file names a `FileToolConfig` allows. Opt-in: pass them to `open(tools=[...])` like any Tool (the
profile's allowed_tools must list their names).

Every path is made canonical first (symlinks and `..` resolved by the operating system), then checked:
under one of `allowed_dirs` (none: nothing is allowed), extension not denied, in `allowed_extensions`
when given, file name matching neither `deny_regex` nor failing `allow_regex`. A refused path, or a
failed read or write, is not an exception: the model gets `{"error": "..."}` as the result and can try
another path (a model guessing a path outside its area is expected, not a bug in the program). Tool names,
inputs and result shapes are those of upstream BAE's Python SDK, so a profile or prompt written for one
works with the other. Reads, writes and listings are bounded (`max_bytes`, `max_entries`).
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass, field
from typing import Any

from bae_client.tools import Tool

MAX_BYTES = 1024 * 1024
MAX_ENTRIES = 1000


@dataclass(frozen=True)
class FileToolConfig:
    allowed_dirs: list[str]
    allowed_extensions: list[str] | None = None  # without the dot, any case; None: any extension
    denied_extensions: list[str] = field(default_factory=list)  # wins over allowed_extensions
    allow_regex: re.Pattern[str] | None = None  # on the file name
    deny_regex: re.Pattern[str] | None = None
    create_parents: bool = False  # may write_file create missing directories?
    max_bytes: int = MAX_BYTES  # the most read_file returns and write_file writes
    max_entries: int = MAX_ENTRIES  # the most explore_files lists


def _canonical(path: str) -> str:
    """`path` with every symlink and `..` resolved; a part that does not exist yet (a file to write) is
    appended to its longest existing ancestor, resolved."""
    absolute = os.path.abspath(path) if not os.path.isabs(path) else path
    missing: list[str] = []
    current = absolute
    while True:
        try:
            resolved = os.path.realpath(current, strict=True)
            break
        except FileNotFoundError:
            head, tail = os.path.split(current)
            if head == current or tail in ("", ".", ".."):
                raise
            missing.insert(0, tail)
            current = head
    return os.path.join(resolved, *missing)


def _extension(name: str) -> str:
    """The extension of a file name, lowercased; a dotfile's name is its extension (`.env` -> `env`)."""
    dot = name.rfind(".")
    return "" if dot == -1 or dot == len(name) - 1 else name[dot + 1:].lower()


def _within(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip(os.sep) + os.sep)


def check(config: FileToolConfig, requested: str) -> tuple[str, str]:
    """(canonical path, the allowed directory it is in); ValueError saying why when it is refused."""
    try:
        path = _canonical(requested)
    except OSError as exc:
        raise ValueError(f"cannot resolve {requested!r}: {exc.strerror or exc}") from exc
    for directory in config.allowed_dirs:
        try:
            root = os.path.realpath(directory, strict=True)
        except OSError:
            continue
        if _within(path, root):
            break
    else:
        raise ValueError(f"{requested!r} is not under any allowed directory")
    name, extension = os.path.basename(path), _extension(path)
    if extension and extension in {denied.lstrip(".").lower() for denied in config.denied_extensions}:
        raise ValueError(f"extension .{extension} is denied")
    if config.allowed_extensions is not None and extension not in {
            allowed.lstrip(".").lower() for allowed in config.allowed_extensions}:
        raise ValueError("extension is not in the allowed set")
    if config.deny_regex is not None and config.deny_regex.search(name):
        raise ValueError("file name matches the deny pattern")
    if config.allow_regex is not None and not config.allow_regex.search(name):
        raise ValueError("file name does not match the allow pattern")
    return path, root


def _error(reason: str) -> str:
    return json.dumps({"error": reason})


def _path_of(input: dict[str, Any], tool: str) -> str:
    path = input.get("path")
    if not isinstance(path, str) or not path:
        raise TypeError(f"{tool} requires a string `path`")
    return path


def read_file_tool(config: FileToolConfig) -> Tool:
    """`read_file {path}` -> `{"path", "content"}` (UTF-8 text, at most config.max_bytes)."""

    def read_file(input: dict[str, Any]) -> str:
        try:
            requested = _path_of(input, "read_file")
            path, _ = check(config, requested)
        except (TypeError, ValueError) as exc:
            return _error(f"path not permitted: {exc}" if isinstance(exc, ValueError) else str(exc))
        try:
            with open(path, "rb") as file:
                data = file.read(config.max_bytes + 1)
        except OSError as exc:
            return _error(f"read failed: {exc.strerror or exc}")
        if len(data) > config.max_bytes:
            return _error(f"read failed: the file is larger than {config.max_bytes} bytes")
        try:
            return json.dumps({"path": requested, "content": data.decode("utf-8")})
        except UnicodeDecodeError:
            return _error("read failed: the file is not UTF-8 text")

    return Tool("read_file", "Read a UTF-8 text file. The path must be one the tool's configuration allows; "
                             "any other path returns an error result.",
                {"type": "object", "properties": {"path": {"type": "string", "description": "The file's path."}},
                 "required": ["path"], "additionalProperties": False}, read_file)


def write_file_tool(config: FileToolConfig) -> Tool:
    """`write_file {path, content}` -> `{"path", "bytes_written"}`."""

    def write_file(input: dict[str, Any]) -> str:
        try:
            requested = _path_of(input, "write_file")
            path, _ = check(config, requested)
        except (TypeError, ValueError) as exc:
            return _error(f"path not permitted: {exc}" if isinstance(exc, ValueError) else str(exc))
        content = input.get("content")
        data = (content if isinstance(content, str) else "").encode("utf-8")
        if len(data) > config.max_bytes:
            return _error(f"write failed: more than {config.max_bytes} bytes")
        parent = os.path.dirname(path)
        if not os.path.isdir(parent):
            if not config.create_parents:
                return _error("path not permitted: the parent directory does not exist (create_parents is off)")
            try:
                os.makedirs(parent, exist_ok=True)
            except OSError as exc:
                return _error(f"could not create the parent directories: {exc.strerror or exc}")
        try:
            with open(path, "wb") as file:
                file.write(data)
        except OSError as exc:
            return _error(f"write failed: {exc.strerror or exc}")
        return json.dumps({"path": requested, "bytes_written": len(data)})

    return Tool("write_file", "Write a UTF-8 text file. The path must be one the tool's configuration allows, "
                              "and its directory must exist unless the configuration lets it be created.",
                {"type": "object", "properties": {"path": {"type": "string", "description": "The file's path."},
                                                  "content": {"type": "string", "description": "The text."}},
                 "required": ["path", "content"], "additionalProperties": False}, write_file)


def explore_files_tool(config: FileToolConfig) -> Tool:
    """`explore_files {path, recursive?}` -> `[{"path", "is_dir", "size_bytes"}, ...]`, paths relative to the
    allowed directory, sorted; only entries read_file would accept, never through a symlink leaving it."""

    def explore_files(input: dict[str, Any]) -> str:
        try:
            requested = _path_of(input, "explore_files")
            path, root = check(config, requested)
        except (TypeError, ValueError) as exc:
            return _error(f"path not permitted: {exc}" if isinstance(exc, ValueError) else str(exc))
        if not os.path.isdir(path):
            return _error(f"{requested!r} is not a directory")
        entries: list[dict[str, Any]] = []
        pending: list[str] = [path]
        listed: set[str] = set()
        while pending and len(entries) < config.max_entries:
            directory = pending.pop()
            try:
                names = sorted(os.listdir(directory))
            except OSError:
                continue
            for name in names:
                try:
                    child = os.path.realpath(os.path.join(directory, name), strict=True)
                except OSError:
                    continue
                if not _within(child, root) or child == root or child in listed:
                    # A symlink out of the allowed directory is neither listed nor followed; one to a place
                    # listed already (a loop) is listed once.
                    continue
                listed.add(child)
                is_dir = os.path.isdir(child)
                try:
                    check(config, child)
                except ValueError:
                    pass
                else:
                    size = 0 if is_dir else os.path.getsize(child)
                    entries.append({"path": os.path.relpath(child, root), "is_dir": is_dir, "size_bytes": size})
                if is_dir and input.get("recursive") is True:
                    pending.append(child)
        entries.sort(key=lambda entry: entry["path"])
        return json.dumps(entries[:config.max_entries])

    return Tool("explore_files", "List the files under a directory the tool's configuration allows "
                                 "(recursive=true descends). Lists only files read_file would accept.",
                {"type": "object", "properties": {"path": {"type": "string", "description": "The directory."},
                                                  "recursive": {"type": "boolean",
                                                                "description": "Descend into subdirectories."}},
                 "required": ["path"], "additionalProperties": False}, explore_files)
