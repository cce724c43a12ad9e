"""Background commands: the table a sandbox host keeps in memory, and their lifecycle.

The host owns every command it starts: its output keeps being collected and
its end recorded whatever happens to the caller, who reads them back later
(a restarted caller finds them with ListCommands). A finished command stays
until its sandbox is stopped or the host restarts, within the bounds below.
"""

from __future__ import annotations

import asyncio
import enum

from bae.common.errors import Conflict, NotFound, TooManyRequests
from bae.services.sandbox.driver import Driver, new_tag
from bae.services.sandbox.output import CappedOutput

# Finished commands kept per sandbox and per host; beyond them the oldest finished go first.
MAX_FINISHED_PER_SANDBOX = 256
MAX_FINISHED = 1024
# Commands running at once in one sandbox (each has a reader thread on the host).
MAX_RUNNING_PER_SANDBOX = 256
COMMAND_ID_LIMIT = 128
# How long a kill waits for the command's streams to close before answering.
KILL_WAIT = 10.0
STOPPED_WITH_SANDBOX = "the sandbox was stopped"


class CommandState(enum.Enum):
    """CommandStatus.State of sandbox.proto, by name."""

    RUNNING = "RUNNING"
    EXITED = "EXITED"
    TIMED_OUT = "TIMED_OUT"
    KILLED = "KILLED"
    FAILED = "FAILED"


class Command:
    """One background command. A thread reading the Docker daemon's stream appends its output and reports its end."""

    def __init__(self, command_id: str, sandbox_id: str, output_limit: int) -> None:
        self.command_id = command_id
        self.sandbox_id = sandbox_id
        # Unique per start, whatever the caller's id: the command's processes are tagged with it.
        self.token = new_tag()
        self.stdout = CappedOutput(output_limit)
        self.stderr = CappedOutput(output_limit)
        self.state = CommandState.RUNNING
        self.exit_code = 0
        self.detail = ""
        self.timer: asyncio.Task[None] | None = None
        self._loop = asyncio.get_running_loop()
        self._done = asyncio.Event()
        # Set just before the host kills it: the state and detail it then ends with.
        self._stopping: tuple[CommandState, str] | None = None

    @property
    def running(self) -> bool:
        return self.state is CommandState.RUNNING

    def stopping(self, state: CommandState, detail: str = "") -> None:
        """The host is about to kill it; the first reason given is the one recorded."""
        if self.running and self._stopping is None:
            self._stopping = (state, detail)

    def not_stopping(self) -> None:
        """The kill did not happen after all."""
        self._stopping = None

    def ended(self, exit_code: int, failure: str | None = None) -> None:
        """Any thread: its streams closed. `failure`: why it could not be followed to its end."""
        try:
            self._loop.call_soon_threadsafe(self._end, exit_code, failure)
        except RuntimeError:  # the loop is closed: the host is exiting, and the table with it
            pass

    def _end(self, exit_code: int, failure: str | None) -> None:
        if self._stopping is not None:
            (self.state, self.detail), self.exit_code = self._stopping, -1
        elif failure is not None:
            self.state, self.detail, self.exit_code = CommandState.FAILED, failure, -1
        else:
            self.state, self.exit_code = CommandState.EXITED, exit_code
        self._done.set()
        if self.timer is not None:
            self.timer.cancel()

    async def wait(self, seconds: float) -> None:
        """Until it ends, for at most `seconds`."""
        if self.running and seconds > 0:
            try:
                await asyncio.wait_for(self._done.wait(), seconds)
            except TimeoutError:
                pass


class CommandTable:
    """Every tracked command by id, in start order."""

    def __init__(self) -> None:
        self._commands: dict[str, Command] = {}

    def add(self, command: Command) -> None:
        if command.command_id in self._commands:
            raise Conflict(f'command "{command.command_id}" already exists')
        running = sum(1 for other in self.of_sandbox(command.sandbox_id) if other.running)
        if running >= MAX_RUNNING_PER_SANDBOX:
            raise TooManyRequests(f"too many running commands in this sandbox (at most {MAX_RUNNING_PER_SANDBOX})")
        self._evict(command.sandbox_id)
        self._commands[command.command_id] = command

    def _evict(self, sandbox_id: str) -> None:
        finished = [command for command in self._commands.values() if not command.running]
        mine = [command for command in finished if command.sandbox_id == sandbox_id]
        for command in mine[: max(0, len(mine) + 1 - MAX_FINISHED_PER_SANDBOX)]:
            self.remove(command)
            finished.remove(command)
        for command in finished[: max(0, len(finished) + 1 - MAX_FINISHED)]:
            self.remove(command)

    def get(self, command_id: str) -> Command:
        command = self._commands.get(command_id)
        if command is None:
            raise NotFound(f'no such command: "{command_id}"')
        return command

    def remove(self, command: Command) -> None:
        if self._commands.get(command.command_id) is command:
            del self._commands[command.command_id]

    def all(self) -> list[Command]:
        return list(self._commands.values())

    def of_sandbox(self, sandbox_id: str) -> list[Command]:
        return [command for command in self._commands.values() if command.sandbox_id == sandbox_id]


class BackgroundCommands:
    """Starts, times out, kills and forgets background commands through the driver."""

    def __init__(self, driver: Driver, output_limit: int) -> None:
        self._driver = driver
        self._output_limit = output_limit
        self._table = CommandTable()

    async def start(
        self, sandbox_id: str, command_id: str, script: str, stdin: bytes, timeout: float, output_limit: int
    ) -> Command:
        """`output_limit` 0 (or more than the host's limit) keeps the host's limit; `timeout` 0: none."""
        limit = min(output_limit, self._output_limit) if output_limit else self._output_limit
        command = Command(command_id, sandbox_id, limit)
        self._table.add(command)
        try:
            await self._driver.spawn(command, script, stdin)
        except BaseException:
            self._table.remove(command)
            raise
        if timeout > 0 and command.running:
            command.timer = asyncio.create_task(self._expire(command, timeout))
        return command

    async def _expire(self, command: Command, timeout: float) -> None:
        await asyncio.sleep(timeout)
        await self._kill(command, CommandState.TIMED_OUT)

    async def _kill(self, command: Command, state: CommandState) -> None:
        if not command.running:
            return
        command.stopping(state)
        await self._driver.kill(command)
        await command.wait(KILL_WAIT)

    async def kill(self, command_id: str) -> Command:
        command = self._table.get(command_id)
        await self._kill(command, CommandState.KILLED)
        return command

    async def wait(self, command_id: str, seconds: float) -> Command:
        command = self._table.get(command_id)
        await command.wait(seconds)
        return command

    def list(self) -> list[Command]:
        return self._table.all()

    async def stop_sandbox(self, sandbox_id: str) -> bool:
        """Stop the sandbox; its running commands die with it (KILLED), then the host forgets them all."""
        commands = self._table.of_sandbox(sandbox_id)
        for command in commands:
            command.stopping(CommandState.KILLED, STOPPED_WITH_SANDBOX)
        try:
            was_running = await self._driver.stop(sandbox_id)
        except BaseException:
            for command in commands:
                command.not_stopping()
            raise
        # Callers already waiting on one still get its end; later calls find no such command.
        await asyncio.gather(*(command.wait(KILL_WAIT) for command in commands))
        for command in commands:
            self._table.remove(command)
        return was_running
