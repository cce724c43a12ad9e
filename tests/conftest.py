"""Shared fixtures: stacks of real service processes or in this process, the mock LLM, and the unit tier's guard."""

from __future__ import annotations

import asyncio
import subprocess
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Iterator

import pytest

from testkit import stack_logs
from testkit.mockllm import MockLLM
from testkit.stack import RunningStack, StackFactory, launch_stack

if TYPE_CHECKING:
    from playwright.sync_api import Page

    from testkit.inprocess import InProcessStack


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


@pytest.fixture
def start_inprocess_stack(tmp_path: Path) -> Iterator[Callable[..., "InProcessStack"]]:
    """Start a fresh stack in this process (testkit/inprocess.py): start_inprocess_stack(config_toml=..., **env)."""
    # Imported here: it loads every service (the provider SDKs take seconds), which the unit tier never needs.
    from testkit.inprocess import InProcessStack

    started: list[InProcessStack] = []

    def start(config_toml: str | None = None, **env: str) -> InProcessStack:
        tmp = tmp_path / f"inprocess{len(started)}"
        tmp.mkdir()
        running = InProcessStack(tmp, config_toml, **env)
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


def pytest_runtest_logstart(nodeid: str, location: tuple[str, int | None, str]) -> None:
    stack_logs.test_started()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    """A test that fails in its setup or its call shows its stacks' service log warnings and errors
    (testkit/stack_logs.py): the logs are gone with the temporary directory after the run."""
    outcome = yield
    report = outcome.get_result()
    if report.failed and report.when in ("setup", "call"):
        shown = stack_logs.failure_report()
        if shown:
            report.sections.append(("stack service logs: warnings and errors", shown))


def pytest_runtest_setup(item: pytest.Item) -> None:
    """A browser test without a browser skips (fails under CI) before its fixtures start a stack."""
    if item.get_closest_marker("browser") is not None:
        from testkit.browser import require_browser

        require_browser()


@pytest.fixture
def browser_page(tmp_path: Path) -> Iterator["Page"]:
    """A page of a headless Chromium of its own (testkit/browser.py)."""
    # Imported here: the unit tier never needs playwright.
    from testkit.browser import chromium_page

    with chromium_page(tmp_path / "chromium-profile") as page:
        yield page


@pytest.fixture(autouse=True)
def unit_tests_start_no_process(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    """A test marked unit runs in this process alone: starting a child process fails it.

    pytest.fail raises an exception `except Exception` does not catch, so the code under test cannot
    swallow it.
    """
    if request.node.get_closest_marker("unit") is None:
        return

    def refuse(*args: object, **kwargs: object) -> None:
        pytest.fail("a test marked unit started a child process: mark it with the tier it needs "
                    "(stack, docker or postgres; see pyproject.toml)", pytrace=True)

    monkeypatch.setattr(subprocess.Popen, "__init__", refuse)
    monkeypatch.setattr(asyncio, "create_subprocess_exec", refuse)
    monkeypatch.setattr(asyncio, "create_subprocess_shell", refuse)
