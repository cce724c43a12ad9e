"""The attempt walk over [primary, resolved fallbacks] (SERVER-SPEC §8.4).

`run_step` yields each event as soon as it exists (so the session service
can append and broadcast it while the next attempt runs), then exactly one
`StepOutcome`. A step that streams (someone listens for deltas) calls each
provider through its SDK's streaming API and yields each piece of output as a
`StepDelta` as it comes; the events it records are the same as without
streaming, the `provider.response` holding the response put together in the
shape the call answers without streaming (the wire modules' StreamAssembly).
"""

from __future__ import annotations

import asyncio
import bisect
import contextlib
import itertools
import logging
import time
from collections import deque
from dataclasses import dataclass, replace
from typing import Any, AsyncGenerator, AsyncIterator, Callable, Protocol

from bae.common.config import Config, EnvResolutionError, ProviderEntry, primary_not_configured, resolve_env
from bae.common import telemetry
from bae.common.jsontext import RawJson, dump, load
from bae.common.redact import redact, redact_whole
from bae.services.runner import anthropic_wire, openai_wire
from bae.services.runner.attempt_span import end_attempt, start_attempt
from bae.services.runner.canonical import DeltaKind, History, JsonObject, Message, Piece, Usage, WireFormatError
from bae.services.runner.clients import ANTHROPIC, OPENAI, ProviderClients, StreamBroken, TransportError, WireResponse

log = logging.getLogger("bae.runner")

PROVIDER_REQUESTS = "bae.provider.requests"
PROVIDER_LATENCY = "bae.provider.latency"

COMPACTION = "compaction"
PROVIDER_REQUEST = "provider.request"
# A provider that answers a turn's call within this long has its provider.request sent to the
# session service with its answer, to be written in one commit with it: a message each way, a
# commit and a broadcast fewer per call. A slower provider's request event goes out when this has
# passed, while the call goes on. A compaction's is never held: it is written before the summary,
# which the database may have no room for, and a failed compaction keeps its request (§12.4).
REQUEST_EVENT_HOLD = 0.005
# Answers that say "not now": too many requests, and Anthropic's "overloaded". Their `Retry-After`
# is honoured (docs/engine.md, "Provider attempts").
RATE_LIMITED = frozenset({429, 529})


@dataclass(frozen=True)
class StepSpec:
    session_id: str
    primary: str
    fallbacks: list[str]
    history: History
    tools: list[JsonObject]
    tools_json: RawJson  # `tools` as the session sent it, passed on without re-serializing
    purpose: str = ""  # "" for a turn, "compaction"
    min_max_tokens: int = 0
    stream_deltas: bool = False  # call providers with their streaming APIs, yielding StepDelta


@dataclass(frozen=True)
class StepEvent:
    event_type: str
    payload: JsonObject
    # provider.request: `messages` is left out of `payload`, being the step's history as it came.
    messages_as_sent: bool = False
    # The walk goes on waiting for a provider after this event: the events so far should go out now.
    then_waits: bool = False


@dataclass(frozen=True)
class StepDelta:
    """A piece of a streamed attempt's output, `seq` from 0 per attempt; a failed streamed
    attempt ends with a RESET one."""

    seq: int
    index: int
    kind: DeltaKind
    text: str


@dataclass(frozen=True)
class StepOutcome:
    """OK carries `message`; ALL_FAILED `attempts`; PROVIDER_CONFIG `detail`."""

    outcome: str  # "ok" | "all_failed" | "provider_config"
    message: Message | None = None
    usage: Usage | None = None
    # What the answering entry's prices make of `usage`: None without usage or prices.
    cost_usd: float | None = None
    attempts: int = 0
    detail: str = ""
    truncated: str = ""


@dataclass(frozen=True)
class _Success:
    status: int
    body: JsonObject
    message: Message
    usage: Usage | None
    truncated: str


@dataclass(frozen=True)
class _Failure:
    status: int | None
    detail: str
    body: str | None
    retry_after: float | None = None  # the wait a RATE_LIMITED answer asked for, in seconds


@dataclass(frozen=True)
class _Try:
    """One attempt to make: an entry of the chain, or one that asked to be tried again later."""

    entry: ProviderEntry
    kind: str  # "primary" | "fallback": the entry's place in the chain, a retry's too
    not_before: float = 0.0  # loop time before which a retry is not made
    retried: bool = False


@dataclass(frozen=True)
class _Prepared:
    """One attempt's canonical history and tools, as values and as JSON text made once.

    The text goes into the `provider.request` event and, for Anthropic (whose
    wire shape is the canonical one), into the request body as well.
    """

    history: History
    tools: list[JsonObject]
    tools_json: RawJson


class _Assembly(Protocol):
    """A streamed response put together (anthropic_wire.StreamAssembly, openai_wire.StreamAssembly)."""

    def feed(self, event: Any) -> list[Piece]: ...

    def body(self) -> JsonObject: ...


@dataclass(frozen=True)
class _Wire:
    """How one provider kind prepares messages, shapes a request and reads a response."""

    # (the history to send, the `normalized` event field or None)
    normalize: Callable[[History], tuple[History, JsonObject | None]]
    request_body: Callable[[str, int, _Prepared], JsonObject]
    usage: Callable[[JsonObject], Usage | None]
    assistant_message: Callable[[JsonObject], Message]
    truncation: Callable[[JsonObject], str]
    # What a streamed call adds to the request body, and what puts its answer together.
    stream_options: JsonObject
    assembly: Callable[[], _Assembly]


WIRES = {
    ANTHROPIC: _Wire(
        anthropic_wire.normalize_history,
        lambda model, max_tokens, prepared: anthropic_wire.request_body(
            model, max_tokens, prepared.history.json, prepared.tools_json
        ),
        anthropic_wire.usage,
        anthropic_wire.assistant_message,
        anthropic_wire.truncation,
        anthropic_wire.STREAM_OPTIONS,
        anthropic_wire.StreamAssembly,
    ),
    OPENAI: _Wire(
        # Chat Completions takes any role order: nothing to normalize (§8.5).
        lambda history: (history, None),
        lambda model, max_tokens, prepared: openai_wire.request_body(
            model, max_tokens, prepared.history.messages, prepared.tools
        ),
        openai_wire.usage,
        openai_wire.assistant_message,
        openai_wire.truncation,
        openai_wire.STREAM_OPTIONS,
        openai_wire.StreamAssembly,
    ),
}


def resolve_chain(config: Config, spec: StepSpec) -> list[ProviderEntry] | None:
    """[primary, fallbacks…] entries; None when the primary is not in the registry."""
    primary = config.provider(spec.primary)
    if primary is None:
        return None
    chain = [primary]
    for name in spec.fallbacks:
        entry = config.provider(name)
        if entry is None:
            log.error(
                "session %s: fallback provider %r is not configured in bae-config.toml; skipped",
                spec.session_id,
                name,
            )
        else:
            chain.append(entry)
    return chain


async def run_step(
    spec: StepSpec, config: Config, clients: ProviderClients, retry_after_limit: float
) -> AsyncIterator[StepEvent | StepDelta | StepOutcome]:
    """The walk: each entry of the chain once, in order, until one answers; then, if all failed,
    each entry whose RATE_LIMITED answer asked for a wait of at most `retry_after_limit` seconds
    once more, when its wait is over, in the order the waits end."""
    chain = resolve_chain(config, spec)
    if chain is None:
        yield StepOutcome("provider_config", detail=primary_not_configured(spec.primary))
        return
    history = spec.history.without_routing_fields()
    compaction = spec.purpose == COMPACTION
    purpose = {"purpose": spec.purpose} if spec.purpose else {}
    request_event_hold = 0.0 if compaction else REQUEST_EVENT_HOLD
    loop = asyncio.get_running_loop()
    tries = deque(_Try(entry, "primary" if index == 0 else "fallback") for index, entry in enumerate(chain))
    retries: list[_Try] = []  # in the order their waits end
    for attempt in itertools.count():
        if tries:
            current = tries.popleft()
        elif retries:
            current = retries.pop(0)
            # A cancel of the step (its caller gave up, or the step's deadline passed) ends this at once.
            await asyncio.sleep(max(current.not_before - loop.time(), 0.0))
        else:
            yield StepOutcome("all_failed", attempts=attempt)
            return
        entry = current.entry
        base = {
            "attempt": attempt,
            "kind": current.kind,
            "provider": entry.provider,
        }
        wire = WIRES[entry.provider]
        max_tokens = max(entry.max_tokens, spec.min_max_tokens)
        sent, normalized = wire.normalize(history)
        prepared = _Prepared(sent, spec.tools, spec.tools_json)
        # The caller has the history it sent: when that is what goes out, it adds the messages
        # itself (as the last member) instead of receiving them back.
        as_sent = sent is spec.history
        request_payload = {
            **base,
            "base_url": entry.effective_base_url,
            "model": entry.model,
            "max_tokens": max_tokens,
            "tools": prepared.tools_json,
            **({"normalized": normalized} if normalized is not None else {}),
            **purpose,
            **({} if as_sent else {"messages": sent.json}),
        }
        span = start_attempt(entry, attempt, current.kind)
        streamed = 0  # deltas the attempt yielded
        if spec.stream_deltas:
            # Its deltas name the request event: it goes out first, at once.
            yield StepEvent(PROVIDER_REQUEST, request_payload, messages_as_sent=as_sent, then_waits=True)
            ended = False
            try:
                # Closed at once when the step is abandoned: the provider's stream with it.
                async with contextlib.aclosing(_streamed_attempt(entry, wire, max_tokens, prepared, clients)) as items:
                    async for item in items:
                        if isinstance(item, Piece):
                            yield StepDelta(streamed, item.index, item.kind, item.text)
                            streamed += 1
                        else:
                            result = item
                ended = True
            finally:
                if not ended:
                    end_attempt(span, False, None, "attempt abandoned")
        else:
            # The HTTP call starts now; the request event goes out with its answer, or while it runs.
            attempt_call = asyncio.ensure_future(_attempt(entry, wire, max_tokens, prepared, clients))
            try:
                if request_event_hold:
                    await asyncio.wait((attempt_call,), timeout=request_event_hold)
                yield StepEvent(
                    PROVIDER_REQUEST, request_payload, messages_as_sent=as_sent, then_waits=not attempt_call.done()
                )
                result = await attempt_call
            finally:
                attempt_call.cancel()  # a no-op once done; stops the call when the step is abandoned
                if not attempt_call.done() or attempt_call.cancelled():
                    end_attempt(span, False, None, "attempt abandoned")
        ok = isinstance(result, _Success)
        telemetry.count(PROVIDER_REQUESTS, {"provider": entry.provider, "outcome": "ok" if ok else "error"})
        if isinstance(result, _Success):
            yield StepEvent(
                "provider.response",
                {
                    **base,
                    "ok": True,
                    "status": result.status,
                    "body": result.body,
                    "usage": result.usage.to_json() if result.usage else None,
                    **purpose,
                },
            )
            end_attempt(span, True, result.status, "")
            yield StepOutcome(
                "ok",
                message=result.message,
                usage=result.usage,
                cost_usd=entry.cost_usd(result.usage.input_tokens, result.usage.output_tokens) if result.usage else None,
                attempts=attempt + 1,
                truncated=result.truncated if compaction else "",
            )
            return
        log.warning(
            "session %s: provider %r attempt %d failed: %s",
            spec.session_id,
            entry.name,
            attempt,
            result.detail,
        )
        retry = _retry(current, result, retry_after_limit, loop.time())
        if retry is not None:
            bisect.insort(retries, retry, key=lambda later: later.not_before)
            log.info(
                "session %s: provider %r asked for %.3g s; it is tried again then if no other entry answers",
                spec.session_id,
                entry.name,
                result.retry_after,
            )
        if spec.stream_deltas:  # whatever it streamed is void, before its failure is recorded
            yield StepDelta(streamed, 0, DeltaKind.RESET, "")
        # What this attempt records goes out before a wait for a retry.
        waits = not tries and bool(retries)
        call_failed = attempt == 0 and not spec.purpose and bool(tries or retries)
        yield StepEvent(
            "provider.response",
            {
                **base,
                "ok": False,
                "status": result.status,
                "error": result.detail,
                "body": result.body,
                **({"retry_after": round(result.retry_after, 3)} if result.retry_after is not None else {}),
                **purpose,
            },
            then_waits=waits and not call_failed,
        )
        if call_failed:
            yield StepEvent(
                "session.error",
                {"reason": "provider_call_failed", "provider": entry.provider, "detail": result.detail},
                then_waits=waits,
            )
        end_attempt(span, False, result.status, result.detail)


def _retry(tried: _Try, failure: _Failure, limit: float, now: float) -> _Try | None:
    """`tried` once more after the wait its answer asked for, if that is at most `limit` seconds;
    a retry is not retried."""
    wait = failure.retry_after
    if tried.retried or wait is None or wait > limit:
        return None
    return replace(tried, not_before=now + wait, retried=True)


async def _attempt(
    entry: ProviderEntry,
    wire: _Wire,
    max_tokens: int,
    prepared: _Prepared,
    clients: ProviderClients,
) -> _Success | _Failure:
    """One HTTP call; every way it can go wrong becomes a `_Failure` for the walk to log."""
    try:
        token = resolve_env(entry.auth_token, "provider config")
    except EnvResolutionError as exc:
        return _Failure(None, str(exc), None)
    body = wire.request_body(entry.model, max_tokens, prepared)
    started = time.perf_counter()
    try:
        response = await clients.post(entry.provider, entry.effective_base_url, token, body)
    except TransportError as exc:
        return _Failure(None, redact(str(exc), token), None)
    except Exception as exc:  # an SDK-side failure must fail the attempt, not the stream
        log.exception("provider %r: unexpected client error", entry.name)
        return _Failure(None, redact(f"{type(exc).__name__}: {exc}", token), None)
    finally:
        telemetry.record(PROVIDER_LATENCY, (time.perf_counter() - started) * 1000, {"provider": entry.provider})

    return _answer(wire, response, token)


def _answer(wire: _Wire, response: WireResponse, token: str) -> _Success | _Failure:
    """What an answer makes of the attempt."""
    # A failure's text is what echoes a piece of the key (`invalid x-api-key sk-ant-…`); an answer,
    # maybe megabytes of output, is searched for whole secrets (bae.common.redact says why).
    ok = 200 <= response.status < 300
    text = redact_whole(response.text, token) if ok else redact(response.text, token)
    if not ok:
        retry_after = response.retry_after if response.status in RATE_LIMITED else None
        return _Failure(response.status, f"provider returned HTTP {response.status}", text, retry_after)
    try:
        parsed = load(text)
    except ValueError as exc:
        return _Failure(response.status, f"provider returned non-JSON body: {exc}", redact(text, token))
    if not isinstance(parsed, dict):
        return _Failure(response.status, "provider returned non-JSON body: expected an object", redact(text, token))
    try:
        message = wire.assistant_message(parsed)
    except WireFormatError as exc:
        return _Failure(None, redact(str(exc), token), redact(text, token))
    return _Success(response.status, parsed, message, wire.usage(parsed), wire.truncation(parsed))


async def _streamed_attempt(
    entry: ProviderEntry,
    wire: _Wire,
    max_tokens: int,
    prepared: _Prepared,
    clients: ProviderClients,
) -> AsyncGenerator[Piece | _Success | _Failure, None]:
    """One streamed HTTP call: each piece of output as it comes, then the attempt's result, the
    response put together as the call answers without streaming. Bounded as a call that does not
    stream is: the whole attempt within the clients' timeout."""
    try:
        token = resolve_env(entry.auth_token, "provider config")
    except EnvResolutionError as exc:
        yield _Failure(None, str(exc), None)
        return
    body = {**wire.request_body(entry.model, max_tokens, prepared), **wire.stream_options}
    assembly = wire.assembly()
    loop = asyncio.get_running_loop()
    started = time.perf_counter()
    deadline = loop.time() + clients.timeout
    failure: _Failure | None = None
    try:
        # No yield inside a timeout: it would cancel whatever the consumer awaits meanwhile.
        async with asyncio.timeout_at(deadline):
            answer = await clients.open_stream(entry.provider, entry.effective_base_url, token, body)
        if isinstance(answer, WireResponse):
            yield _answer(wire, answer, token)
            return
        try:
            events = aiter(answer)
            while True:
                async with asyncio.timeout_at(deadline):
                    event = await anext(events, None)
                if event is None:
                    break
                for piece in assembly.feed(event):
                    # Searched for whole secrets, as an answer is: a delta is a few characters.
                    yield replace(piece, text=redact_whole(piece.text, token))
        finally:
            await answer.close()
    except TimeoutError:
        failure = _Failure(None, f"request timed out after {clients.timeout:g} s", None)
    except TransportError as exc:
        failure = _Failure(None, redact(str(exc), token), None)
    except StreamBroken as exc:
        failure = _Failure(200, redact(str(exc), token), redact(exc.body, token) if exc.body is not None else None)
    except WireFormatError as exc:
        failure = _Failure(200, redact(str(exc), token), None)
    except Exception as exc:  # an SDK-side failure must fail the attempt, not the stream
        log.exception("provider %r: unexpected client error", entry.name)
        failure = _Failure(None, redact(f"{type(exc).__name__}: {exc}", token), None)
    finally:
        telemetry.record(PROVIDER_LATENCY, (time.perf_counter() - started) * 1000, {"provider": entry.provider})
    if failure is not None:
        yield failure
        return
    try:
        whole = assembly.body()
    except WireFormatError as exc:
        yield _Failure(200, redact(str(exc), token), None)
        return
    yield _answer(wire, WireResponse(200, dump(whole)), token)
