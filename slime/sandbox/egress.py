"""A session's one way out: connections to a listener inside its slot, spliced to one configured target.

The operator names the targets (``--egress NAME=HOST:PORT``, none by default); a session asks for
one by name. The slot's init listens on ``127.0.0.1:<egress port>`` inside the slot's network
namespace and hands the socket over (`slot_session.py`); `EgressForwarder` accepts on it here, in
the server's namespace, and connects each accepted connection to the target, bytes copied both
ways with half-close kept (HTTP keep-alive and streaming work). Every other address stays
unreachable from the slot: its namespace has only loopback. Connections are bounded in number,
counted, and all closed with the session.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import socket

logger = logging.getLogger(__name__)
CHUNK = 1 << 16


def parse_egress_targets(specs: list[str]) -> dict[str, tuple[str, int]]:
    """``["gateway=127.0.0.1:8000", ...]`` -> ``{"gateway": ("127.0.0.1", 8000)}``; ValueError names the flag."""
    out: dict[str, tuple[str, int]] = {}
    for spec in specs:
        name, sep, addr = spec.partition("=")
        host, colon, port = addr.rpartition(":")
        if not sep or not name or not colon or not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise ValueError(f"--egress {spec!r}: expected NAME=HOST:PORT (e.g. gateway=127.0.0.1:8000)")
        if name in out:
            raise ValueError(f"--egress {spec!r}: the name {name!r} is given twice")
        out[name] = (host.strip("[]"), int(port))
    return out


@dataclasses.dataclass
class EgressCounters:
    connections: int = 0  # accepted and connected to the target
    refused: int = 0  # over the session's connection cap
    failed: int = 0  # the target did not answer the connect
    bytes_out: int = 0  # sandbox -> target
    bytes_in: int = 0  # target -> sandbox


class EgressForwarder:
    """Accepts on `listener` (a socket of the slot's namespace) and splices each connection to `target`."""

    def __init__(
        self,
        listener: socket.socket,
        target: tuple[str, int],
        *,
        max_connections: int = 64,
        connect_timeout: float = 10.0,
    ) -> None:
        self.listener, self.target = listener, target
        self.max_connections, self.connect_timeout = max_connections, connect_timeout
        self.counters = EgressCounters()
        self._server: asyncio.base_events.Server | None = None
        self._tasks: set[asyncio.Task] = set()

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._accepted, sock=self.listener, limit=CHUNK)

    async def close(self) -> None:
        """Stop accepting and cut every open connection (the session is over)."""
        if self._server is not None:
            self._server.close()
        for task in list(self._tasks):
            task.cancel()
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)
        if self._server is not None:
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._server.wait_closed(), 5)
            self._server = None

    async def _accepted(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        if len(self._tasks) >= self.max_connections:
            self.counters.refused += 1
            writer.close()
            return
        self._tasks.add(task)
        try:
            await self._splice(reader, writer)
        finally:
            self._tasks.discard(task)
            writer.close()

    async def _splice(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            up_r, up_w = await asyncio.wait_for(
                asyncio.open_connection(*self.target, limit=CHUNK), self.connect_timeout
            )
        except (OSError, asyncio.TimeoutError) as e:
            self.counters.failed += 1
            logger.warning("egress to %s:%d failed: %s", *self.target, e)
            return
        self.counters.connections += 1
        try:
            await asyncio.gather(self._pump(reader, up_w, "bytes_out"), self._pump(up_r, writer, "bytes_in"))
        finally:
            up_w.close()

    async def _pump(self, src: asyncio.StreamReader, dst: asyncio.StreamWriter, counter: str) -> None:
        """Copy until EOF, then half-close the other side; a reset ends the copy."""
        try:
            while chunk := await src.read(CHUNK):
                dst.write(chunk)
                setattr(self.counters, counter, getattr(self.counters, counter) + len(chunk))
                await dst.drain()
            if dst.can_write_eof():
                dst.write_eof()
        except (ConnectionError, OSError):
            dst.close()
