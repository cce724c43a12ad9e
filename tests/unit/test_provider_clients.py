"""The runner's SDK clients: one per provider under light load, more as requests run at once; the wait a
failed answer asks for."""

from __future__ import annotations

import asyncio
import dataclasses
import email.utils
import time

import httpx2
import pytest

from bae.services.runner.clients import (
    ANTHROPIC,
    CLIENTS_PER_PROVIDER,
    REQUESTS_PER_CLIENT,
    ProviderClients,
    WireResponse,
    retry_after,
)
from testkit.mockllm import MockLLM, Reply

pytestmark = pytest.mark.unit

BODY = {"model": "mock-model", "max_tokens": 16, "messages": [{"role": "user", "content": "hi"}]}


async def test_one_client_serves_requests_in_turn_and_more_are_made_only_for_concurrent_ones() -> None:
    clients = ProviderClients(timeout=30)
    with MockLLM() as llm:
        try:
            for _ in range(3):
                assert (await clients.post(ANTHROPIC, llm.base_url, "token", BODY)).status == 200
            assert len(clients._clients[(ANTHROPIC, llm.base_url)]) == 1

            concurrent = REQUESTS_PER_CLIENT * (CLIENTS_PER_PROVIDER + 1)
            llm.enqueue(*[dataclasses.replace(Reply.text("slow"), seconds=0.3)] * concurrent)
            answers = await asyncio.gather(
                *(clients.post(ANTHROPIC, llm.base_url, "token", BODY) for _ in range(concurrent))
            )
            assert [answer.status for answer in answers] == [200] * concurrent
            pool = clients._clients[(ANTHROPIC, llm.base_url)]
            assert len(pool) == CLIENTS_PER_PROVIDER  # bounded, however many run at once
            assert all(pooled.in_flight == 0 for pooled in pool)  # each request gave its place back
        finally:
            await clients.close()


def headers(**fields: str) -> httpx2.Headers:
    return httpx2.Headers({name.replace("_", "-"): value for name, value in fields.items()})


def test_retry_after_reads_as_the_sdks_read_it() -> None:
    assert retry_after(headers(retry_after="2")) == 2.0
    assert retry_after(headers(retry_after="0.5")) == 0.5
    # Milliseconds come first; a header that is not a number is passed over.
    assert retry_after(headers(retry_after_ms="250", retry_after="9")) == 0.25
    assert retry_after(headers(retry_after_ms="soon", retry_after="9")) == 9.0
    later = retry_after(headers(retry_after=email.utils.formatdate(time.time() + 30, usegmt=True)))
    assert later is not None and 28 < later <= 30
    # No wait asked for: none given, not positive, not finite, not a date, a date past.
    for asked in (headers(), headers(retry_after="0"), headers(retry_after="-3"), headers(retry_after="nan"),
                  headers(retry_after="inf"), headers(retry_after="1e400"), headers(retry_after_ms="0", retry_after="5"),
                  headers(retry_after="next week"), headers(retry_after="Wed, 21 Oct 2015 07:28:00 GMT")):
        assert retry_after(asked) is None, asked


async def test_a_failed_answer_carries_the_wait_it_asks_for() -> None:
    clients = ProviderClients(timeout=30)
    with MockLLM() as llm:
        try:
            llm.enqueue(Reply.error(429, "slow down", {"retry-after": "3"}), Reply.error(500, "boom"))
            assert await clients.post(ANTHROPIC, llm.base_url, "token", BODY) == WireResponse(429, "slow down", 3.0)
            assert await clients.post(ANTHROPIC, llm.base_url, "token", BODY) == WireResponse(500, "boom", None)
        finally:
            await clients.close()
