"""Shared fixtures: stacks of real service processes, and the mock LLM."""

from __future__ import annotations

from pathlib import Path
from typing import Iterator

import pytest

from testkit.mockllm import MockLLM
from testkit.stack import RunningStack, StackFactory, launch_stack


@pytest.fixture
def start_stack(tmp_path: Path) -> Iterator[StackFactory]:
    """Start a fresh stack: start_stack(config_toml=..., **env_overrides)."""
    started: list[RunningStack] = []

    def start(config_toml: str | None = None, session_args: list[str] | None = None, **env) -> RunningStack:
        tmp = tmp_path / f"stack{len(started)}"
        tmp.mkdir()
        running = launch_stack(tmp, config_toml, session_args, **env)
        started.append(running)
        return running

    yield start
    for running in started:
        running.close()


@pytest.fixture(scope="module")
def mock() -> Iterator[MockLLM]:
    """One scripted mock LLM per test module (tests reset or enqueue as they need)."""
    llm = MockLLM().start()
    yield llm
    llm.stop()
