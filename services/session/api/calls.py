"""What a handler receives: the request reduced to typed values at this service's edge.

The servicer builds these from the protobuf request; handlers never see the
protobuf message or the raw Authorization header.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from bae.common.errors import unauthorized
from bae.common.protos import session_pb2


@dataclass(frozen=True)
class Credential:
    """The bearer token of the Authorization header, or why there is none (SERVER-SPEC §2.2).

    Parsed once; a handler asks for `token()` at the point where the spec checks it,
    so a refusal keeps its place in each route's check order.
    """

    _token: str | None
    _problem: str | None = None

    @classmethod
    def from_header(cls, header: str, present: bool) -> "Credential":
        if not present or not header.isascii():
            return cls(None, "missing Authorization header")
        if header[:7] not in ("Bearer ", "bearer "):
            return cls(None, "Authorization header must be a Bearer token")
        if not header[7:]:
            return cls(None, "empty bearer token")
        return cls(header[7:])

    def token(self) -> str:
        """The token; a 401 problem with the spec's text when the header gave none."""
        if self._token is None:
            raise unauthorized(self._problem or "missing Authorization header")
        return self._token


@dataclass(frozen=True)
class RestCall:
    """One REST request: its credential, the `{id}` path segment, body and query."""

    credential: Credential
    path_id: str
    body: bytes
    content_type: str
    query: Mapping[str, str]

    @classmethod
    def of(cls, request: session_pb2.RestRequest) -> "RestCall":
        return cls(
            credential=Credential.from_header(request.authorization, request.has_authorization),
            path_id=request.path_id,
            body=request.body,
            content_type=request.content_type,
            query=dict(request.query),
        )
