"""The pieces every JSON-RPC method of the session service shares (SERVER-SPEC §6).

The authenticated call a method receives, its params as the gateway read them (or the -32602
text of why they did not fit, answered where the method reads them), and the gates each method
passes first: the -32001 driver check and, when asked, the -32000 state check.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Generic, TypeVar

from google.protobuf.message import Message as ProtoMessage

from bae.common.jsontext import load
from bae.common.protos import client_api_pb2
from bae.common.rpc_codes import RpcCode
from bae.services.session.api.faults import RpcFault, invalid_params
from bae.services.session.engine.domain import Message, SessionState
from bae.services.session.engine.errors import SessionNotOpen
from bae.services.session.engine.live import LiveSession
from bae.services.session.engine.registry import SessionRegistry
from bae.services.session.store.records import Principal, ProfileRecord, SessionRecord

P = TypeVar("P", bound=ProtoMessage)


@dataclass(frozen=True)
class RpcCall(Generic[P]):
    """One authenticated JSON-RPC call: who acts, on which session, with what params.

    Built once per call from one store read (key, session and profile); methods
    never see the Authorization header.
    """

    principal: Principal
    session: SessionRecord | None
    profile: ProfileRecord | None
    _params: P
    # Why the params did not fit ("" when they did), answered when the method reads them.
    _invalid_params: str = ""

    @property
    def session_id(self) -> str:
        return self.principal.session_id

    @property
    def actor(self) -> str:
        """The acting client key."""
        return self.principal.client_key_id

    def params(self) -> P:
        """The params; -32602 `Invalid params: …` here, at the method's place in the spec's order
        of checks, when they did not fit."""
        if self._invalid_params:
            raise invalid_params(self._invalid_params)
        return self._params

    def open_session(self) -> SessionRecord:
        """The session record, if open (-32000 `session is <state>, not open` otherwise)."""
        if self.session is None or self.session.state != SessionState.OPEN:
            raise SessionNotOpen.of(self.session.state if self.session else None)
        return self.session


async def require_driver(sessions: SessionRegistry, call: RpcCall[P], method: str) -> LiveSession:
    """The -32001 gate: the acting key must have registered on this session.

    An open session this replica does not serve yet (it took it over, or restarted) is attached
    first: its registrations come back from the log (registry.rebuild), so a driver registered
    before keeps driving without registering again."""
    live = sessions.get(call.session_id)
    if live is None and call.session is not None and call.session.state == SessionState.OPEN:
        try:
            live = await sessions.attach(call.session_id)
        except SessionNotOpen:
            live = None
    if live is None or call.actor not in live.drivers:
        raise RpcFault(RpcCode.DRIVER_NOT_REGISTERED, f"call session.registerDriver before {method}")
    return live


def message_of(params: client_api_pb2.SendMessageParams) -> Message:
    message = params.message
    role = message.role if message.HasField("role") else "user"
    return Message(role=role, content=load(message.content.json))
