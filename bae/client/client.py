"""The client port: opening and joining sessions with a client key."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Sequence

import httpx

from bae.client.errors import raise_for_problem
from bae.client.session import Session


@dataclass(frozen=True)
class ToolDef:
    """A client tool declaration (sent at open/join; the profile must allow its name)."""

    name: str
    description: str = ""
    input_schema: dict[str, Any] = field(default_factory=lambda: {"type": "object"})

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "description": self.description, "input_schema": self.input_schema}


class Client:
    """The client port: opens and joins sessions with a client key (`bae_…`)."""

    def __init__(self, base_url: str, timeout: float | None = 300.0) -> None:
        self.http = httpx.Client(base_url=base_url.rstrip("/"), timeout=timeout)

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self.http.close()

    def meta(self) -> dict[str, Any]:
        response = self.http.get("/api/v1/meta")
        raise_for_problem(response)
        meta: dict[str, Any] = response.json()
        return meta

    def open(self, client_key: str, *, tools: Sequence[ToolDef] = (), client_version: str | None = None,
             **body: Any) -> Session:
        """POST /api/v1/sessions; `body` carries the other open fields (e.g. `compaction`)."""
        request = {"tools": [tool.to_json() for tool in tools], **body}
        if client_version is not None:
            request["client_version"] = client_version
        return self._session("/api/v1/sessions", client_key, request)

    def join(self, session_id: str, client_key: str, *, tools: Sequence[ToolDef] = (), **body: Any) -> Session:
        """POST /api/v1/sessions/{id}/join: a new session key for another client key on the same profile."""
        request = {"tools": [tool.to_json() for tool in tools], **body}
        return self._session(f"/api/v1/sessions/{session_id}/join", client_key, request)

    def _session(self, path: str, client_key: str, body: dict[str, Any]) -> Session:
        response = self.http.post(path, json=body, headers={"Authorization": f"Bearer {client_key}"})
        raise_for_problem(response)
        opened = response.json()
        return Session(self.http, opened["session_id"], opened["session_key"], opened.get("profile", {}))
