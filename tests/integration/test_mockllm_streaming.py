"""The mock LLM streams as the real APIs do: the official SDKs' streaming APIs read it over real HTTP and
assemble exactly the body the same reply gives unstreamed; pace, pause, and failures go as scripted."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from typing import Any, Iterator

import anthropic
import httpx
import httpx2
import openai
import pytest
from openai.lib.streaming.chat import ChatCompletionStreamState

from testkit.mockllm import MockLLM, Reply, word_pieces

# In this process, but the OpenAI SDK runs `uname -p` once for its platform header: not the unit tier.
pytestmark = pytest.mark.inprocess

MESSAGES = [{"role": "user", "content": "hi"}]
CALL = ("tu_1", "get_weather", {"city": "Paris", "days": [1, 2], "units": "metric"})
REPLIES = {
    "text": Reply.text("Hello big world"),
    "pieces": Reply.text("Hello big world").streaming(pieces=("Hel", "lo big wor", "ld")),
    "tool_use": Reply.tool_use([CALL, ("tu_2", "noop", {})], text="Let me look."),
    "tool_use_alone": Reply.tool_use([CALL]),
    "thinking": Reply.thinking("The user greets me, so I greet back.", "Hello there"),
    "truncated": Reply.truncated("Cut off at the"),
    "cached_usage": Reply("text", reply_text="cached", usage=(3, 4, 100, 20)),
    "empty": Reply.text(""),
}


@pytest.fixture
def llm() -> Iterator[MockLLM]:
    with MockLLM() as mock:
        yield mock


def anthropic_client(llm: MockLLM) -> anthropic.AsyncAnthropic:
    return anthropic.AsyncAnthropic(base_url=llm.base_url, api_key="sk-test", max_retries=0)


def openai_client(llm: MockLLM) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=llm.base_url + "/v1", api_key="sk-test", max_retries=0)


async def unstreamed(llm: MockLLM, path: str, reply: Reply) -> dict:
    llm.enqueue(reply)
    async with httpx.AsyncClient() as client:
        answer = await client.post(llm.base_url + path, json={"model": "mock-model", "messages": MESSAGES})
    assert answer.status_code == 200
    return answer.json()


async def raw_stream(llm: MockLLM, path: str, reply: Reply, **body: Any) -> tuple[httpx.Response, str]:
    llm.enqueue(reply)
    async with httpx.AsyncClient() as client:
        request = {"model": "mock-model", "messages": MESSAGES, "stream": True, **body}
        answer = await client.post(llm.base_url + path, json=request)
    return answer, answer.text


def sse_events(text: str) -> list[tuple[str | None, str]]:
    """(event name, data) of each event of a complete event stream."""
    events = []
    for block in text.split("\n\n"):
        if not block:
            continue
        fields = dict(line.split(": ", 1) for line in block.split("\n"))
        events.append((fields.get("event"), fields["data"]))
    return events


def assemble_anthropic(text: str) -> dict:
    """The plainest reading: message_start's message, blocks appended, deltas concatenated, message_delta merged."""
    message: dict = {}
    partial: dict[int, str] = {}
    for name, data in sse_events(text):
        event = json.loads(data)
        assert event["type"] == name
        if name == "message_start":
            message = event["message"]
        elif name == "content_block_start":
            assert event["index"] == len(message["content"])
            message["content"].append(event["content_block"])
        elif name == "content_block_delta":
            block, delta = message["content"][event["index"]], event["delta"]
            if delta["type"] == "input_json_delta":
                partial[event["index"]] = partial.get(event["index"], "") + delta["partial_json"]
            else:
                field = {"text_delta": "text", "thinking_delta": "thinking", "signature_delta": "signature"}
                block[field[delta["type"]]] += delta[field[delta["type"]]]
        elif name == "content_block_stop":
            if event["index"] in partial:
                message["content"][event["index"]]["input"] = json.loads(partial[event["index"]])
        elif name == "message_delta":
            message.update(event["delta"])
            if "usage" in event:
                message["usage"].update(event["usage"])
    return message


def without(body: dict, *keys: str) -> dict:
    return {key: value for key, value in body.items() if key not in keys}


# -- Anthropic ----------------------------------------------------------------


@pytest.mark.parametrize("name", REPLIES)
async def test_an_anthropic_stream_assembles_into_the_unstreamed_body(llm: MockLLM, name: str) -> None:
    reply = REPLIES[name]
    whole = await unstreamed(llm, "/v1/messages", reply)
    answer, text = await raw_stream(llm, "/v1/messages", reply)
    assert answer.status_code == 200
    assert answer.headers["content-type"].startswith("text/event-stream")
    assert without(assemble_anthropic(text), "id") == without(whole, "id")

    llm.enqueue(reply)
    client = anthropic_client(llm)
    async with client.messages.stream(model="mock-model", max_tokens=64, messages=MESSAGES) as stream:
        final = await stream.get_final_message()
    assert [block.model_dump(exclude_none=True) for block in final.content] == whole["content"]
    assert final.stop_reason == whole["stop_reason"]
    assert final.usage.model_dump(exclude_none=True) == whole["usage"]
    assert final.model == "mock-model" and final.id.startswith("msg_mock_")


async def test_an_anthropic_stream_sends_the_events_of_the_real_api_in_their_order(llm: MockLLM) -> None:
    _, text = await raw_stream(llm, "/v1/messages", Reply.tool_use([CALL], text="Hello big world"))
    events = [json.loads(data) for _, data in sse_events(text)]
    assert [event["type"] for event in events] == [
        "message_start",
        "content_block_start", "ping", *["content_block_delta"] * 3, "content_block_stop",
        "content_block_start", *["content_block_delta"] * len(word_pieces(json.dumps(CALL[2]))), "content_block_stop",
        "message_delta", "message_stop",
    ]  # fmt: skip
    start = events[0]["message"]
    assert start["content"] == [] and start["stop_reason"] is None and start["stop_sequence"] is None
    assert start["usage"] == {"input_tokens": 10, "output_tokens": 1}
    assert [event["delta"]["text"] for event in events[3:6]] == ["Hello ", "big ", "world"]
    assert events[7]["content_block"] == {"type": "tool_use", "id": "tu_1", "name": "get_weather", "input": {}}
    partial_json = [event["delta"]["partial_json"] for event in events[8:-3]]
    assert len(partial_json) > 1 and json.loads("".join(partial_json)) == CALL[2]
    assert events[-2] == {
        "type": "message_delta",
        "delta": {"stop_reason": "tool_use", "stop_sequence": None},
        "usage": {"output_tokens": 5},
    }


async def test_the_anthropic_sdk_reads_text_and_thinking_deltas_as_they_come(llm: MockLLM) -> None:
    llm.enqueue(Reply.thinking("Think hard", "Hello big world"))
    seen: list[tuple[str, str]] = []
    async with anthropic_client(llm).messages.stream(model="m", max_tokens=64, messages=MESSAGES) as stream:
        async for event in stream:
            if event.type in ("text", "thinking", "signature"):
                seen.append((event.type, getattr(event, event.type)))
    assert seen == [
        ("thinking", "Think "), ("thinking", "hard"), ("signature", "mock-signature"),
        ("text", "Hello "), ("text", "big "), ("text", "world"),
    ]  # fmt: skip


async def test_a_reply_without_usage_streams_none(llm: MockLLM) -> None:
    reply = Reply.text("hi there", usage=None)
    _, text = await raw_stream(llm, "/v1/messages", reply)
    assert without(assemble_anthropic(text), "id") == without(await unstreamed(llm, "/v1/messages", reply), "id")
    assert "usage" not in assemble_anthropic(text)
    _, text = await raw_stream(llm, "/v1/chat/completions", reply, stream_options={"include_usage": True})
    chunks = [json.loads(data) for _, data in sse_events(text)[:-1]]
    assert all(chunk["choices"] and chunk["usage"] is None for chunk in chunks)


# -- OpenAI -------------------------------------------------------------------


async def openai_chunks(llm: MockLLM, reply: Reply, include_usage: bool = True) -> list[Any]:
    llm.enqueue(reply)
    options: Any = {"include_usage": True} if include_usage else openai.NOT_GIVEN
    stream = await openai_client(llm).chat.completions.create(
        model="mock-model", messages=MESSAGES, stream=True, stream_options=options  # type: ignore[arg-type]
    )
    return [chunk async for chunk in stream]


@pytest.mark.parametrize("name", REPLIES)
async def test_an_openai_stream_assembles_into_the_unstreamed_body(llm: MockLLM, name: str) -> None:
    reply = REPLIES[name]
    whole = await unstreamed(llm, "/v1/chat/completions", reply)
    chunks = await openai_chunks(llm, reply)
    assert {(chunk.id, chunk.model, chunk.created, chunk.object) for chunk in chunks} == {
        (chunks[0].id, "mock-model", chunks[0].created, "chat.completion.chunk")
    }
    assert chunks[0].choices[0].delta.role == "assistant"
    assert chunks[-1].choices == [] and chunks[-1].usage is not None
    assert chunks[-2].choices[0].finish_reason == whole["choices"][0]["finish_reason"]

    state = ChatCompletionStreamState()
    for chunk in chunks:
        state.handle_chunk(chunk)
    try:
        final = state.get_final_completion()
    except openai.LengthFinishReasonError as refused:  # the SDK refuses a truncated answer, and holds it
        final = refused.completion
    expected = whole["choices"][0]["message"]
    message = final.choices[0].message
    assert message.role == "assistant" and message.content == expected["content"]
    calls = [
        {"id": call.id, "type": call.type, "function": {"name": call.function.name, "arguments": call.function.arguments}}
        for call in message.tool_calls or []
    ]
    assert calls == expected.get("tool_calls", [])
    assert final.choices[0].finish_reason == whole["choices"][0]["finish_reason"]
    assert final.usage is not None and final.usage.model_dump(exclude_none=True) == whole["usage"]
    assert final.id.startswith("chatcmpl-mock-") and final.model == "mock-model"


async def test_an_openai_stream_carries_usage_only_when_asked_and_ends_with_done(llm: MockLLM) -> None:
    chunks = await openai_chunks(llm, Reply.text("Hello big world"), include_usage=False)
    assert all(chunk.choices and chunk.usage is None for chunk in chunks)
    assert [chunk.choices[0].delta.content for chunk in chunks] == ["", "Hello ", "big ", "world", None]

    answer, text = await raw_stream(llm, "/v1/chat/completions", Reply.tool_use([CALL]))
    assert answer.headers["content-type"].startswith("text/event-stream")
    assert text.endswith("data: [DONE]\n\n")
    chunks = [json.loads(data) for _, data in sse_events(text)[:-1]]
    deltas = [chunk["choices"][0]["delta"] for chunk in chunks]
    assert deltas[0] == {"role": "assistant", "content": None}  # no text: content stays null
    assert deltas[1] == {"tool_calls": [{"index": 0, "id": "tu_1", "type": "function",
                                         "function": {"name": "get_weather", "arguments": ""}}]}
    pieces = [delta["tool_calls"][0]["function"]["arguments"] for delta in deltas[2:-1]]
    assert len(pieces) > 1 and json.loads("".join(pieces)) == CALL[2]
    assert chunks[-1]["choices"][0] == {"index": 0, "delta": {}, "logprobs": None, "finish_reason": "tool_calls"}


async def test_the_openai_stream_helper_reads_the_mock(llm: MockLLM) -> None:
    llm.enqueue(Reply.thinking("unseen here", "Hello big world"))
    client = openai_client(llm)
    async with client.chat.completions.stream(model="m", messages=MESSAGES) as stream:  # type: ignore[arg-type]
        deltas = [event.delta async for event in stream if event.type == "content.delta"]
        final = await stream.get_final_completion()
    assert deltas == ["", "Hello ", "big ", "world"]  # the first chunk's empty content, as the real API sends
    assert final.choices[0].message.content == "Hello big world"


# -- scripted pace, pause and failures ----------------------------------------


async def test_pace_spaces_the_stream_events(llm: MockLLM) -> None:
    llm.enqueue(Reply.text("a b c").streaming(pace=0.05))
    started = time.monotonic()
    async with anthropic_client(llm).messages.stream(model="m", max_tokens=9, messages=MESSAGES) as stream:
        text = await stream.get_final_text()
    # 9 events (message_start, block start, ping, 3 deltas, block stop, message_delta, message_stop), 8 gaps:
    # a lower bound only (sleeps never end early).
    assert text == "a b c" and time.monotonic() - started >= 8 * 0.05


async def next_text(stream: Any) -> str:
    async for event in stream:
        if event.type == "text":
            return str(event.text)
    raise AssertionError("the stream ended")


@pytest.mark.parametrize("path", ["anthropic", "openai"])
async def test_a_paused_stream_goes_on_once_resumed(llm: MockLLM, path: str) -> None:
    resume = threading.Event()
    llm.enqueue(Reply.text("Hello big world").streaming(pause_at=2, resume=resume))
    if path == "anthropic":
        async with anthropic_client(llm).messages.stream(model="m", max_tokens=9, messages=MESSAGES) as stream:
            assert [await next_text(stream), await next_text(stream)] == ["Hello ", "big "]
            waiting = asyncio.ensure_future(next_text(stream))
            done, _ = await asyncio.wait([waiting], timeout=0.3)
            assert not done  # held after the second delta
            resume.set()
            assert await waiting == "world"
            assert (await stream.get_final_message()).stop_reason == "end_turn"
    else:
        client = openai_client(llm)
        async with client.chat.completions.stream(model="m", messages=MESSAGES) as stream:  # type: ignore[arg-type]
            events = aiter(stream)
            texts = []
            while len(texts) < 2:
                event = await anext(events)
                if event.type == "content.delta" and event.delta:
                    texts.append(event.delta)
            assert texts == ["Hello ", "big "]
            waiting = asyncio.ensure_future(anext(events))
            done, _ = await asyncio.wait([waiting], timeout=0.3)
            assert not done
            resume.set()
            await waiting
            assert (await stream.get_final_completion()).choices[0].message.content == "Hello big world"
    assert llm.aborted == []


async def test_a_pause_at_zero_holds_the_stream_before_its_first_delta(llm: MockLLM) -> None:
    resume = threading.Event()
    llm.enqueue(Reply.text("a b").streaming(pause_at=0, resume=resume))
    async with anthropic_client(llm).messages.stream(model="m", max_tokens=9, messages=MESSAGES) as stream:
        events = aiter(stream)
        assert [(await anext(events)).type, (await anext(events)).type] == ["message_start", "content_block_start"]
        waiting = asyncio.ensure_future(next_text(stream))
        done, _ = await asyncio.wait([waiting], timeout=0.3)
        assert not done
        resume.set()
        assert await waiting == "a "


@pytest.mark.parametrize("how", ["paused", "paced"])
async def test_a_client_that_leaves_a_stream_aborts_the_request(llm: MockLLM, how: str) -> None:
    resume = threading.Event()
    reply = Reply.thinking("a b", "c d")
    llm.enqueue(reply.streaming(pause_at=3, resume=resume) if how == "paused" else reply.streaming(pace=0.2))
    async with anthropic_client(llm).messages.stream(model="m", max_tokens=9, messages=MESSAGES) as stream:
        assert await next_text(stream) == "c "  # the third content delta, counted over both blocks
    deadline = time.monotonic() + 10
    while not llm.aborted and time.monotonic() < deadline:
        await asyncio.sleep(0.01)
    resume.set()
    assert llm.aborted == [llm.requests[-1]] and llm.requests[-1]["body"]["stream"] is True


async def test_a_cut_stream_makes_the_sdks_raise(llm: MockLLM) -> None:
    reply = Reply.text("Hello big world").streaming(fail_at=2)
    texts: list[str] = []
    llm.enqueue(reply)
    # The anthropic SDK lets its transport's error through; the openai SDK wraps it.
    with pytest.raises(httpx2.RemoteProtocolError):
        async with anthropic_client(llm).messages.stream(model="m", max_tokens=9, messages=MESSAGES) as stream:
            async for text in stream.text_stream:
                texts.append(text)
    assert texts == ["Hello ", "big "]

    llm.enqueue(reply)
    stream = await openai_client(llm).chat.completions.create(model="m", messages=MESSAGES, stream=True)  # type: ignore[arg-type]
    contents: list[Any] = []
    with pytest.raises(openai.APIConnectionError):
        async for chunk in stream:
            contents.append(chunk.choices[0].delta.content)
    assert contents == ["", "Hello ", "big "]


async def test_an_in_stream_error_makes_the_sdks_raise_the_providers_error(llm: MockLLM) -> None:
    reply = Reply.tool_use([CALL], text="Hi").streaming(fail_at=2, failure="error")
    llm.enqueue(reply)
    with pytest.raises(anthropic.APIStatusError) as raised:
        async with anthropic_client(llm).messages.stream(model="m", max_tokens=9, messages=MESSAGES) as stream:
            await stream.get_final_message()
    assert raised.value.body == {"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}

    llm.enqueue(reply)
    stream = await openai_client(llm).chat.completions.create(model="m", messages=MESSAGES, stream=True)  # type: ignore[arg-type]
    chunks: list[Any] = []
    with pytest.raises(openai.APIError) as failed:
        async for chunk in stream:
            chunks.append(chunk)
    assert isinstance(failed.value.body, dict) and failed.value.body["type"] == "server_error"
    # The role chunk, "Hi", the call's opening and its first argument piece: two content deltas.
    assert len(chunks) == 4 and chunks[1].choices[0].delta.content == "Hi"
    assert llm.aborted == []


async def test_a_script_counting_beyond_the_stream_is_answered_with_the_reason(llm: MockLLM) -> None:
    answer, text = await raw_stream(llm, "/v1/messages", Reply.text("one two").streaming(fail_at=3))
    assert answer.status_code == 500 and "2 content deltas" in text


# -- what did not change ------------------------------------------------------


async def test_unstreamed_requests_get_the_same_body_whatever_the_stream_script(llm: MockLLM) -> None:
    plain = Reply.tool_use([CALL], text="Hello big world")
    scripted = plain.streaming(pieces=("Hello", " big world"), pace=0.5, fail_at=1, failure="error")
    for path in ("/v1/messages", "/v1/chat/completions"):
        assert without(await unstreamed(llm, path, plain), "id", "created") == without(
            await unstreamed(llm, path, scripted), "id", "created"
        )
    assert without(await unstreamed(llm, "/v1/messages", Reply.text("hi")), "id") == {
        "type": "message",
        "role": "assistant",
        "model": "mock-model",
        "content": [{"type": "text", "text": "hi"}],
        "stop_reason": "end_turn",
        "stop_sequence": None,
        "usage": {"input_tokens": 10, "output_tokens": 5},
    }
    # An error is answered whole even to a stream request, as the real APIs fail before a stream starts.
    answer, text = await raw_stream(llm, "/v1/messages", Reply.error(529, '{"type":"error"}'))
    assert answer.status_code == 529 and answer.headers["content-type"] == "application/json"


def test_text_is_cut_at_word_boundaries_and_scripts_are_checked() -> None:
    assert word_pieces("Hello big world") == ["Hello ", "big ", "world"]
    assert word_pieces("  two\nlines  ") == ["  ", "two\n", "lines  "]
    assert "".join(word_pieces(json.dumps(CALL[2]))) == json.dumps(CALL[2])
    with pytest.raises(ValueError, match="do not join"):
        Reply.text("Hello").streaming(pieces=("Hel", "l"))
    with pytest.raises(ValueError, match="go together"):
        Reply.text("Hello").streaming(pause_at=1)
    with pytest.raises(ValueError, match="failure"):
        Reply.text("Hello").streaming(fail_at=1, failure="explode")
    # A later call keeps what an earlier one set.
    assert Reply.text("a b").streaming(pace=0.5).streaming(fail_at=1).pace == 0.5
