"""The runner's SDK clients: one per provider under light load, more as requests run at once."""

from __future__ import annotations

import asyncio
import dataclasses

import pytest

from services.runner.clients import ANTHROPIC, CLIENTS_PER_PROVIDER, REQUESTS_PER_CLIENT, ProviderClients
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
