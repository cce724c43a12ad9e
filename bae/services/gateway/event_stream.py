"""GET .../sessions/{id}/events/stream: a session's events as Server-Sent Events, for browsers.

The same observer as `session.subscribe` (bae/services/gateway/rpc.py, fanout.py), written as
`text/event-stream`: each event `id: <event id>`, `event: session.event`, `data: <event JSON>`;
with `deltas=true` each delta `event: session.delta`, `data: <delta JSON>`, without an id; a
comment line every 15 s. `since_event_id` (or the `Last-Event-ID` header a reconnecting client
sends, which wins) replays the stored events after that one first. The stream ends when the
session closes or the key is revoked, and also when it fails or falls behind: a client then
reconnects with Last-Event-ID and misses nothing.

The client port's route takes the session key and counts against max_subscribers_per_session;
the admin port's takes the admin token, for a session in any state, and counts against nothing.
"""

from __future__ import annotations

from google.protobuf.message import Message
from starlette.requests import Request
from starlette.responses import Response

from bae.common import errors
from bae.common.protos import admin_api_pb2, client_api_pb2, edge_pb2, session_pb2
from bae.common.rpc_codes import RpcCode
from bae.services.gateway.frames import SSE_WIRE
from bae.services.gateway.problems import error_response, problem_response
from bae.services.gateway.rpc import RpcEndpoint
from bae.services.gateway.upstream import credential_of

# An event id is a few dozen characters; a longer one cannot name an event.
MAX_EVENT_ID_CHARS = 256
_BOOLEANS = {"true": True, "false": False}


class Resume:
    """What a request asks of its stream: where to resume, whether deltas come too."""

    def __init__(self, request: Request) -> None:
        query = request.query_params
        since = request.headers.get("last-event-id") or query.get("since_event_id")
        if since is not None and len(since) > MAX_EVENT_ID_CHARS:
            raise errors.InvalidInput(f"since_event_id (or Last-Event-ID) is over {MAX_EVENT_ID_CHARS} characters")
        deltas = query.get("deltas", "false")
        if deltas not in _BOOLEANS:
            raise errors.InvalidInput('deltas must be "true" or "false"')
        self.since = since
        self.deltas = _BOOLEANS[deltas]


class EventStreamEndpoint:
    """The route on one port: `admin` takes the admin token, else the session key."""

    def __init__(self, rpc: RpcEndpoint, *, admin: bool) -> None:
        self.rpc = rpc
        self.admin = admin

    async def __call__(self, request: Request) -> Response:
        session_id = request.path_params["id"]
        credential = credential_of(request)
        kind = edge_pb2.ADMIN_KEY if self.admin else edge_pb2.SESSION_KEY
        check = session_pb2.CredentialCheck(kind=kind, credential=credential, session_id=session_id)
        try:
            resume = Resume(request)
        except errors.BaeError as error:
            # Authentication comes first: a stranger's bad query is answered 401.
            return await self.rpc.check(check) or error_response(error)
        rpc_name, rpc_request = self._request(session_id, credential, resume)
        # Refused before it began (a quota): an answer of its own, not an empty stream.
        return await self.rpc.observe(
            rpc_name, rpc_request, check, deltas=resume.deltas, wire=SSE_WIRE, request_id_json=None, refusal=_refusal
        )

    def _request(self, session_id: str, credential: edge_pb2.Credential, resume: Resume) -> tuple[str, Message]:
        if self.admin:
            watch = admin_api_pb2.WatchSessionRequest(credential=credential, session_id=session_id, deltas=resume.deltas)
            if resume.since is not None:
                watch.since_event_id = resume.since
            return "WatchSession", watch
        params = client_api_pb2.SubscribeParams(deltas=resume.deltas)
        if resume.since is not None:
            params.since_event_id = resume.since
        subscribe = client_api_pb2.SubscribeRequest(credential=credential, session_id=session_id, params=params)
        return "Subscribe", subscribe


def _refusal(error: client_api_pb2.RpcError) -> Response:
    if error.code == RpcCode.QUOTA_EXCEEDED:
        return problem_response(429, "quota_exceeded", error.message)
    return error_response(errors.Internal("internal server error"))
