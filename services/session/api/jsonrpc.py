"""The pieces every JSON-RPC method of the session service shares (SERVER-SPEC §6).

The authenticated call a method receives, params parsing with the spec's
-32602 texts, and the gates each method passes first: the -32001 driver
check and, when asked, the -32000 state check.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from bae.common import serde
from bae.common.jsontext import JsonSyntaxError, strict_load
from bae.common.protos import session_pb2
from bae.common.rpc_codes import RpcCode
from services.session.api.faults import RpcFault, invalid_params
from services.session.engine.domain import Message, SessionState
from services.session.engine.errors import SessionNotOpen
from services.session.engine.live import LiveSession
from services.session.engine.registry import SessionRegistry
from services.session.store.records import Principal, ProfileRecord, SessionRecord

ACCEPTED = session_pb2.RpcFrame(accepted=True)


@dataclass(frozen=True)
class RpcCall:
    """One authenticated JSON-RPC call: who acts, on which session, with what params.

    Built once per call from one store read (key, session and profile); methods
    never see the protobuf request or the Authorization header.
    """

    principal: Principal
    session: SessionRecord | None
    profile: ProfileRecord | None
    params_json: str

    @property
    def session_id(self) -> str:
        return self.principal.session_id

    @property
    def actor(self) -> str:
        """The acting client key."""
        return self.principal.client_key_id

    def params(self) -> dict[str, Any]:
        """The params object; absent or null is `{}`."""
        try:
            params = strict_load(self.params_json or "{}")
        except JsonSyntaxError as exc:
            raise invalid_params(str(exc)) from None
        if params is None:
            return {}
        if not isinstance(params, dict):
            raise invalid_params(serde.invalid_type(params, "a map"))
        return params

    def open_session(self) -> SessionRecord:
        """The session record, if open (-32000 `session is <state>, not open` otherwise)."""
        if self.session is None or self.session.state != SessionState.OPEN:
            raise SessionNotOpen.of(self.session.state if self.session else None)
        return self.session


def require_driver(sessions: SessionRegistry, call: RpcCall, method: str) -> LiveSession:
    """The -32001 gate: the acting key must have registered on this session."""
    live = sessions.get(call.session_id)
    if live is None or call.actor not in live.drivers:
        raise RpcFault(RpcCode.DRIVER_NOT_REGISTERED, f"call session.registerDriver before {method}")
    return live


def parse_message(params: dict[str, Any]) -> Message:
    if "message" not in params:
        raise invalid_params('missing "message"')
    message = params["message"]
    if not isinstance(message, dict):
        raise invalid_params(serde.invalid_type(message, "struct Message"))
    if "content" not in message:
        raise invalid_params("missing field `content`")
    role = message.get("role", "user")
    if role is None:
        role = "user"
    if not isinstance(role, str):
        raise invalid_params(serde.invalid_type(role, "a string"))
    content = message["content"]
    if not isinstance(content, (str, list)):
        raise invalid_params(serde.invalid_type(content, "a string or an array of content blocks"))
    return Message(role=role, content=content)
