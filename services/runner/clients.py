"""One HTTP attempt through the official SDKs, as raw status + body text.

Clients are cached per (kind, base_url) so connections are reused across
steps, CLIENTS_PER_PROVIDER of them taken in turn: the SDK's connection pool
checks every idle connection it holds (a socket probe each) whenever a request
starts or ends, so one pool's cost per request grows with the concurrency, and
at 64 concurrent sessions that check was a quarter of the runner's CPU. The body is serialized here and sent through the SDK client's generic
`post`: the typed `create` methods deep-copy every request, which costs more
than the HTTP call itself once a history holds a few hundred messages. The
auth token is resolved per attempt, so it never lives on a client: each call
carries it in its own headers. The SDKs' retries are off, so every attempt the
walk makes is exactly one HTTP request (and one logged event pair).
"""

from __future__ import annotations

import asyncio
import itertools
from dataclasses import dataclass

import anthropic
import httpx2
import openai

from bae.jsontext import dump

ANTHROPIC = "anthropic"
OPENAI = "openai"
ANTHROPIC_VERSION = "2023-06-01"
ANTHROPIC_PATH = "/v1/messages"
OPENAI_PATH = "/chat/completions"  # under the client's base URL, which ends in /v1

# The SDKs refuse to build a client without a credential (and would otherwise
# pick one up from the environment or an on-disk profile). This placeholder is
# never sent: every request overrides the auth headers with the real token.
_UNUSED_CREDENTIAL = "bae-per-request-token"


@dataclass(frozen=True)
class WireResponse:
    """An HTTP response of any status; `text` is the raw body."""

    status: int
    text: str


class TransportError(Exception):
    """No HTTP response at all (connect failure, timeout, ...); `str()` is the detail."""


# Each with a connection pool of its own: a pool holds about 1/CLIENTS_PER_PROVIDER of the connections.
CLIENTS_PER_PROVIDER = 8


class ProviderClients:
    def __init__(self, timeout: float) -> None:
        self.timeout = timeout
        self._clients: dict[tuple[str, str], list[anthropic.AsyncAnthropic | openai.AsyncOpenAI]] = {}
        self._turn = itertools.count()

    async def post(self, kind: str, base_url: str, token: str, body: dict) -> WireResponse:
        """POST `body` to the kind's endpoint under `base_url` (no trailing `/`, as
        `ProviderEntry.effective_base_url` gives it)."""
        try:
            # httpx's timeout bounds each read; this bounds the whole attempt.
            async with asyncio.timeout(self.timeout):
                return await self._send(kind, base_url, token, body)
        except TimeoutError:
            raise self._timed_out() from None

    async def _send(self, kind: str, base_url: str, token: str, body: dict) -> WireResponse:
        if kind == ANTHROPIC:
            path, headers = ANTHROPIC_PATH, {"X-Api-Key": token, "Authorization": anthropic.omit}
        else:
            path, headers = OPENAI_PATH, {"Authorization": f"Bearer {token}"}
        try:
            response = await self._client(kind, base_url).post(
                path,
                cast_to=httpx2.Response,
                content=dump(body).encode(),
                options={"headers": headers},  # type: ignore[call-overload]  # RequestOptions is a TypedDict the SDK does not export
            )
        except (anthropic.APIStatusError, openai.APIStatusError) as error:
            return WireResponse(error.response.status_code, error.response.text)
        except (anthropic.APITimeoutError, openai.APITimeoutError):
            raise self._timed_out() from None
        except (anthropic.APIConnectionError, openai.APIConnectionError) as error:
            raise TransportError(_connection_detail(error)) from None
        return WireResponse(response.status_code, response.text)

    def _timed_out(self) -> TransportError:
        return TransportError(f"request timed out after {self.timeout:g} s")

    def _client(self, kind: str, base_url: str) -> anthropic.AsyncAnthropic | openai.AsyncOpenAI:
        clients = self._clients.get((kind, base_url))
        if clients is None:
            clients = self._clients[(kind, base_url)] = [
                self._new_client(kind, base_url) for _ in range(CLIENTS_PER_PROVIDER)
            ]
        return clients[next(self._turn) % CLIENTS_PER_PROVIDER]

    def _new_client(self, kind: str, base_url: str) -> anthropic.AsyncAnthropic | openai.AsyncOpenAI:
        if kind == ANTHROPIC:
            return anthropic.AsyncAnthropic(
                api_key=_UNUSED_CREDENTIAL,
                base_url=base_url,
                max_retries=0,
                timeout=self.timeout,
                default_headers={"anthropic-version": ANTHROPIC_VERSION},
            )
        # The registry's base_url excludes the API version; the SDK's includes it.
        return openai.AsyncOpenAI(
            api_key=_UNUSED_CREDENTIAL,
            base_url=f"{base_url}/v1",
            max_retries=0,
            timeout=self.timeout,
        )

    async def close(self) -> None:
        clients, self._clients = [client for each in self._clients.values() for client in each], {}
        for client in clients:
            await client.close()


def _connection_detail(error: anthropic.APIConnectionError | openai.APIConnectionError) -> str:
    """The SDK's message plus its cause, without the request URL."""
    cause = str(error.__cause__ or "").strip()
    detail = f"connection error: {cause}" if cause else "connection error"
    url = str(error.request.url)
    return detail.replace(f" for url '{url}'", "").replace(url, "")
