"""The request's credential, reduced to a typed value at this service's edge.

The servicer builds it from the request's `Credential` (the Authorization header as it came);
handlers never see the raw header.
"""

from __future__ import annotations

from dataclasses import dataclass

from bae.common.errors import Unauthenticated
from bae.common.protos import edge_pb2


@dataclass(frozen=True)
class Credential:
    """The bearer token of the Authorization header, or why there is none (SERVER-SPEC §2.2).

    Parsed once; a handler asks for `token()` at the point where the spec checks it,
    so a refusal keeps its place in each route's check order. A request without the header
    may instead carry the web console's session cookie (`console_session`, admin port only),
    which only the admin checks accept (auth.Authenticator).
    """

    _token: str | None
    _problem: str | None = None
    console_session: str | None = None

    @classmethod
    def of(cls, credential: edge_pb2.Credential) -> "Credential":
        header = credential.authorization
        if not credential.present and credential.console_session:
            return cls(None, "missing Authorization header", credential.console_session)
        if not credential.present or not header.isascii():
            return cls(None, "missing Authorization header")
        if header[:7] not in ("Bearer ", "bearer "):
            return cls(None, "Authorization header must be a Bearer token")
        if not header[7:]:
            return cls(None, "empty bearer token")
        return cls(header[7:])

    def token(self) -> str:
        """The token; Unauthenticated with the spec's text when the header gave none."""
        if self._token is None:
            raise Unauthenticated(self._problem or "missing Authorization header")
        return self._token
