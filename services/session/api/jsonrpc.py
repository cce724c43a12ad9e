"""The pieces every JSON-RPC method of the session service shares (SERVER-SPEC §6).

Replies and frames in the wire's shapes, params parsing with the spec's
-32602 texts, and the gate each method passes first: authentication, the
-32001 driver check and, when asked, the -32000 state check.
"""

from __future__ import annotations

import json

from bae import serde
from bae.jsontext import dump
from bae.protos import session_pb2

RpcError = session_pb2.RpcError
PROFILE_GONE = "profile_unavailable: the profile bound to this session is no longer available"


def result_reply(value) -> session_pb2.RpcReply:
    return session_pb2.RpcReply(result_json=dump(value))


def error_reply(code: int, message: str) -> session_pb2.RpcReply:
    return session_pb2.RpcReply(error=RpcError(code=code, message=message))


def error_frame(code: int, message: str, id_mode=RpcError.REQUEST_ID) -> session_pb2.RpcFrame:
    return session_pb2.RpcFrame(error=RpcError(code=code, message=message, id_mode=id_mode))


ACCEPTED = session_pb2.RpcFrame(accepted=True)


def not_open(session) -> str | None:
    """The -32000 text when the session is not open, else None."""
    if session is None:
        return "session no longer exists"
    if session.state != "open":
        return f"session is {session.state}, not open"
    return None


class InvalidParams(Exception):
    pass


def parse_params(request) -> dict:
    try:
        params = json.loads(request.params_json or "{}")
    except ValueError as exc:
        raise InvalidParams(f"Invalid params: {exc}") from None
    if params is None:
        return {}
    if not isinstance(params, dict):
        raise InvalidParams(f"Invalid params: {serde.invalid_type(params, 'a map')}")
    return params


def parse_message(params: dict) -> dict:
    if "message" not in params:
        raise InvalidParams('Invalid params: missing "message"')
    message = params["message"]
    if not isinstance(message, dict):
        raise InvalidParams(f"Invalid params: {serde.invalid_type(message, 'struct Message')}")
    if "content" not in message:
        raise InvalidParams("Invalid params: missing field `content`")
    role = message.get("role", "user")
    if role is None:
        role = "user"
    if not isinstance(role, str):
        raise InvalidParams(f"Invalid params: {serde.invalid_type(role, 'a string')}")
    content = message["content"]
    if not isinstance(content, (str, list)):
        raise InvalidParams(
            f"Invalid params: {serde.invalid_type(content, 'a string or an array of content blocks')}"
        )
    return {"role": role, "content": content}


async def gate(auth, runtime, request, method: str, *, needs_open: bool = False):
    """Auth (a Problem), then the -32001 driver gate and, when asked, the -32000 state gate.

    Returns (acting client key, session record, its profile, refusal (code, message) or
    None); the records are None unless `needs_open`. All come from one store call.
    """
    principal, session, profile = await auth.session_principal_and_records(
        request.authorization, request.has_authorization, request.session_id
    )
    actor = principal.client_key_id
    live = runtime.sessions.get(request.session_id)
    if live is None or actor not in live.drivers:
        return actor, None, None, (-32001, f"call session.registerDriver before {method}")
    if not needs_open:
        return actor, None, None, None
    problem = not_open(session)
    return actor, session, profile, (-32000, problem) if problem else None
