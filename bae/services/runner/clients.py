"""One HTTP attempt through the official SDKs, as raw status + body text.

Clients are cached per (kind, base_url) so connections are reused across
steps. The SDK's connection pool checks every idle connection it holds (a
socket probe each) whenever a request starts or ends, so its cost per request
grows with the connections: at 64 concurrent sessions on one client that check
was a quarter of the runner's CPU. So a client takes REQUESTS_PER_CLIENT
requests at once before another is made for the same provider, up to
CLIENTS_PER_PROVIDER; under light load there is one, as there always was. The
body is serialized here and sent through the SDK client's generic
`post`: the typed `create` methods deep-copy every request, which costs more
than the HTTP call itself once a history holds a few hundred messages. The
auth token is resolved per attempt, so it never lives on a client: each call
carries it in its own headers. The SDKs' retries are off, so every attempt the
walk makes is exactly one HTTP request (and one logged event pair); a failed
answer's `Retry-After` is read here, for the walk to decide on.
"""

from __future__ import annotations

import asyncio
import email.utils
import math
import time
from dataclasses import dataclass
from typing import Any, AsyncGenerator, AsyncIterator

import anthropic
import httpx2
import openai

from bae.common.jsontext import dump
from bae.services.runner.canonical import JsonObject

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
    # Seconds a failed answer asks the caller to wait before trying again (`retry_after`), if any.
    retry_after: float | None = None


class TransportError(Exception):
    """No HTTP response at all (connect failure, timeout, ...); `str()` is the detail."""


class StreamBroken(Exception):
    """A streamed answer that had begun ended in an error: the provider's error event (`body` its
    text), or the connection broke (`body` None). `str()` is the detail."""

    def __init__(self, detail: str, body: str | None = None) -> None:
        super().__init__(detail)
        self.body = body


REQUESTS_PER_CLIENT = 8
CLIENTS_PER_PROVIDER = 8

SdkClient = anthropic.AsyncAnthropic | openai.AsyncOpenAI


@dataclass
class _Pooled:
    """One SDK client (and its connection pool) and the requests it carries now."""

    client: SdkClient
    in_flight: int = 0


class ProviderStream:
    """A streamed answer that began (HTTP 2xx): its events, each the raw JSON object the provider
    sent; reading them raises StreamBroken. `close()` must follow, read to the end or not."""

    def __init__(self, sdk_stream: anthropic.AsyncStream[object] | openai.AsyncStream[object], pooled: _Pooled) -> None:
        self._sdk_stream = sdk_stream
        self._events = _events(sdk_stream)
        self._pooled: _Pooled | None = pooled

    def __aiter__(self) -> AsyncIterator[Any]:
        return self._events

    async def close(self) -> None:
        if self._pooled is None:
            return
        self._pooled.in_flight -= 1
        self._pooled = None
        await self._events.aclose()
        await self._sdk_stream.close()


class ProviderClients:
    def __init__(self, timeout: float) -> None:
        self.timeout = timeout
        self._clients: dict[tuple[str, str], list[_Pooled]] = {}

    async def post(self, kind: str, base_url: str, token: str, body: JsonObject) -> WireResponse:
        """POST `body` to the kind's endpoint under `base_url` (no trailing `/`, as
        `ProviderEntry.effective_base_url` gives it)."""
        try:
            # httpx's timeout bounds each read; this bounds the whole attempt.
            async with asyncio.timeout(self.timeout):
                return await self._send(kind, base_url, token, body)
        except TimeoutError:
            raise self._timed_out() from None

    async def open_stream(self, kind: str, base_url: str, token: str, body: JsonObject) -> WireResponse | ProviderStream:
        """POST `body` (which asks for a stream) through the SDK's streaming API: the open stream of
        the provider's events, or the WireResponse of an answer that failed. Raises TransportError
        when there is no answer. Unbounded in time: the caller bounds each wait (the walk, by the
        attempt's deadline), and closes the stream."""
        path, headers = _route(kind, token)
        pooled = self._take(kind, base_url)
        pooled.in_flight += 1
        content = dump(body).encode()
        # `cast_to=object`: each event as the provider sent it, not as the SDK's models.
        events: anthropic.AsyncStream[object] | openai.AsyncStream[object]
        try:
            if isinstance(pooled.client, anthropic.AsyncAnthropic):
                events = await pooled.client.post(
                    path, cast_to=object, content=content, options={"headers": headers},
                    stream=True, stream_cls=anthropic.AsyncStream[object],
                )
            else:
                events = await pooled.client.post(
                    path, cast_to=object, content=content, options={"headers": headers},
                    stream=True, stream_cls=openai.AsyncStream[object],
                )
        except BaseException as error:
            pooled.in_flight -= 1
            if isinstance(error, (anthropic.APIStatusError, openai.APIStatusError)):
                failed = error.response
                return WireResponse(failed.status_code, failed.text, retry_after(failed.headers))
            if isinstance(error, (anthropic.APIConnectionError, openai.APIConnectionError)):  # timeouts too
                raise TransportError(_connection_detail(error)) from None
            raise
        return ProviderStream(events, pooled)

    async def _send(self, kind: str, base_url: str, token: str, body: JsonObject) -> WireResponse:
        path, headers = _route(kind, token)
        pooled = self._take(kind, base_url)
        pooled.in_flight += 1
        try:
            response = await pooled.client.post(
                path,
                cast_to=httpx2.Response,
                content=dump(body).encode(),
                options={"headers": headers},
            )
        except (anthropic.APIStatusError, openai.APIStatusError) as error:
            failed = error.response
            return WireResponse(failed.status_code, failed.text, retry_after(failed.headers))
        except (anthropic.APITimeoutError, openai.APITimeoutError):
            raise self._timed_out() from None
        except (anthropic.APIConnectionError, openai.APIConnectionError) as error:
            raise TransportError(_connection_detail(error)) from None
        finally:
            pooled.in_flight -= 1
        return WireResponse(response.status_code, response.text)

    def _timed_out(self) -> TransportError:
        return TransportError(f"request timed out after {self.timeout:g} s")

    def _take(self, kind: str, base_url: str) -> _Pooled:
        """The first client with room for another request; a new one while there may be more;
        else the least busy."""
        pool = self._clients.setdefault((kind, base_url), [])
        for pooled in pool:
            if pooled.in_flight < REQUESTS_PER_CLIENT:
                return pooled
        if len(pool) < CLIENTS_PER_PROVIDER:
            pool.append(_Pooled(self._new_client(kind, base_url)))
            return pool[-1]
        return min(pool, key=lambda pooled: pooled.in_flight)

    def _new_client(self, kind: str, base_url: str) -> SdkClient:
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
        pools, self._clients = list(self._clients.values()), {}
        for pool in pools:
            for pooled in pool:
                await pooled.client.close()


def _route(kind: str, token: str) -> tuple[str, dict[str, Any]]:
    """The kind's path under the client's base URL, and the headers that carry `token`."""
    if kind == ANTHROPIC:
        return ANTHROPIC_PATH, {"X-Api-Key": token, "Authorization": anthropic.omit}
    return OPENAI_PATH, {"Authorization": f"Bearer {token}"}


async def _events(stream: AsyncIterator[Any]) -> AsyncGenerator[Any, None]:
    """The SDK stream's events; its failures as StreamBroken. Anthropic's `error` event raises
    APIStatusError, OpenAI's `error` chunk APIError; a connection that breaks, APIConnectionError."""
    try:
        async for event in stream:
            yield event
    except anthropic.APIStatusError as error:
        raise StreamBroken("the provider's stream sent an error", _text(error.body)) from None
    except (anthropic.APIConnectionError, openai.APIConnectionError) as error:
        raise StreamBroken(f"the provider's stream broke: {_connection_detail(error)}") from None
    except openai.APIError as error:
        raise StreamBroken("the provider's stream sent an error", _text(error.body)) from None
    except httpx2.HTTPError as error:
        raise StreamBroken(f"the provider's stream broke: {type(error).__name__}: {error}") from None


def _text(body: object) -> str | None:
    if body is None or isinstance(body, str):
        return body
    return dump(body)


def retry_after(headers: httpx2.Headers) -> float | None:
    """The wait, in seconds, a failed answer's headers ask for, read as the SDKs' own retries read it
    (`_parse_retry_after_header` in anthropic's and openai's `_base_client.py`): `retry-after-ms`
    (milliseconds; Anthropic and OpenAI send it), else `retry-after` as seconds (a fraction
    allowed), else `retry-after` as an HTTP date. The first header that reads as a number decides.
    A wait that is not a positive finite number of seconds is no wait asked for: the SDKs fall back
    to their own backoff then, and the walk does not try again."""
    for name, seconds_per_unit in (("retry-after-ms", 0.001), ("retry-after", 1.0)):
        value = headers.get(name)
        if value is None:
            continue
        try:
            number = float(value)
        except ValueError:
            continue
        return _positive(number * seconds_per_unit)
    date = headers.get("retry-after")
    parsed = email.utils.parsedate_tz(date) if date is not None else None
    if parsed is None:
        return None
    try:
        return _positive(email.utils.mktime_tz(parsed) - time.time())
    except (OverflowError, ValueError, OSError):  # a date beyond what the platform's clock can hold
        return None


def _positive(seconds: float) -> float | None:
    return seconds if math.isfinite(seconds) and seconds > 0 else None


def _connection_detail(error: anthropic.APIConnectionError | openai.APIConnectionError) -> str:
    """The SDK's message plus its cause, without the request URL."""
    cause = str(error.__cause__ or "").strip()
    detail = f"connection error: {cause}" if cause else "connection error"
    url = str(error.request.url)
    return detail.replace(f" for url '{url}'", "").replace(url, "")
