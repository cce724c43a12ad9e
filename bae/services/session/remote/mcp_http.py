"""The HTTP client of MCP Streamable HTTP connections, reading within `BAE_MCP_OUTPUT_LIMIT`.

An answer comes as a JSON body or as server-sent events. The SDK bounds each event
(`max_sse_event_size`, given the limit); a JSON body it reads whole, so this transport
stops reading one at the limit and fails it: the SDK then answers the request with a
JSON-RPC error carrying this text, which the model sees as the tool's error. Unlike a
stdio server's, an HTTP server's answer over the limit is not shortened.

Bodies are asked for uncompressed, and a compressed JSON body is refused: the limit
counts what is read from the network, and a few compressed bytes can inflate to gigabytes.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import httpx2

JSON = "application/json"


class AnswerOverLimit(httpx2.StreamError):
    """A JSON answer over the limit; the SDK turns a StreamError into the request's error."""


class CappedTransport(httpx2.AsyncBaseTransport):
    def __init__(self, limit: int, inner: httpx2.AsyncBaseTransport | None = None) -> None:
        self._limit = limit
        self._inner = inner or httpx2.AsyncHTTPTransport()

    async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
        request.headers["Accept-Encoding"] = "identity"
        response = await self._inner.handle_async_request(request)
        if response.headers.get("content-type", "").lower().startswith(JSON):
            assert isinstance(response.stream, httpx2.AsyncByteStream)
            encoding = response.headers.get("content-encoding", "identity").strip().lower()
            response.stream = _CappedBody(response.stream, self._limit, encoded=encoding != "identity")
        return response

    async def aclose(self) -> None:
        await self._inner.aclose()


class _CappedBody(httpx2.AsyncByteStream):
    def __init__(self, inner: httpx2.AsyncByteStream, limit: int, *, encoded: bool) -> None:
        self._inner = inner
        self._limit = limit
        self._encoded = encoded

    async def __aiter__(self) -> AsyncIterator[bytes]:
        if self._encoded:
            raise AnswerOverLimit("the MCP server's answer came compressed, which BAE does not accept")
        read = 0
        async for chunk in self._inner:
            read += len(chunk)
            if read > self._limit:
                raise AnswerOverLimit(f"the MCP server's answer is over BAE_MCP_OUTPUT_LIMIT ({self._limit} bytes)")
            yield chunk

    async def aclose(self) -> None:
        await self._inner.aclose()
