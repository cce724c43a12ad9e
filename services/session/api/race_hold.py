"""A pause point for tests between a live method's session-state check and the
moment it takes the session's live state: the window a close can land in
(SERVER-SPEC §5.5, the close race).

Off unless BAE_TEST_HOLD_ADDR is set, and then only for tests: each call that
reaches the point connects to that address, sends one line `<method> <session id>`
and waits for one line back before it goes on. A test answers at once for calls
it does not care about, and holds the one it does while it closes the session.
"""

from __future__ import annotations

import asyncio

from bae.common.settings import Address


class RaceHold:
    def __init__(self, address: Address | None) -> None:
        self.address = address

    async def reached(self, method: str, session_id: str) -> None:
        if self.address is None:
            return
        reader, writer = await asyncio.open_connection(self.address.host, self.address.port)
        try:
            writer.write(f"{method} {session_id}\n".encode())
            await writer.drain()
            await reader.readline()
        finally:
            writer.close()
