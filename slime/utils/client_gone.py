"""`client_gone(request)`: returns when the HTTP client of a request closed its connection.

An engine stops working on a request whose client went away, as SGLang does (its tokenizer manager
aborts a non-streaming request whose connection closed). This is what makes an abandoned request
cost nothing to abort through a router: the router closes its connection to the engine that had
the request when our client closes its own (sglang-router 0.3.2 does), so the abort reaches
exactly that engine without anyone knowing which one it was.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

from starlette.requests import Request


async def client_gone(request: Request) -> None:
    """Wait for the ASGI `http.disconnect` message (an event from the server, not a poll). Call it
    once the body has been read: every further `receive` waits until the connection closes."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


def client_gone_future(request: Request, on_gone: Callable[[], None] | None = None) -> asyncio.Future:
    """`asyncio.ensure_future(client_gone(request))` without a task: a future whose result is set when
    the client disconnects (its exception, if `receive` raises), and then `on_gone()` is called,
    from the loop, as a done callback would be (not when the future was cancelled). The ASGI
    `receive` coroutine is stepped by the future it waits on, as a task would step it, so a
    request watched this way costs no task creation, no task-registry entry, no cancellation thrown
    through the frames and no callback scheduled when the watch is cancelled. Cancel the future to
    stop watching: `receive` is closed when it next wakes (the connection's end, or the
    response's, wakes it) or when it is collected, never resumed into the caller's code."""
    return _Watch(request.receive, asyncio.get_running_loop(), on_gone).gone


class _Watch:
    __slots__ = ("receive", "loop", "on_gone", "gone", "coro")

    def __init__(
        self,
        receive: Callable[[], Awaitable[dict]],
        loop: asyncio.AbstractEventLoop,
        on_gone: Callable[[], None] | None,
    ) -> None:
        self.receive, self.loop, self.on_gone = receive, loop, on_gone
        self.gone = loop.create_future()
        self.coro = receive()
        self.step()

    def step(self, _waited: Any = None) -> None:
        coro = self.coro
        while True:
            if self.gone.done():  # cancelled: nobody watches any more
                coro.close()
                return
            try:
                waited = coro.send(None)
            except StopIteration as done:
                if done.value["type"] == "http.disconnect":
                    self.gone.set_result(None)
                    self.left()
                    return
                coro = self.coro = self.receive()  # another message (a body's rest): wait for the next
                continue
            except asyncio.CancelledError:  # what it waited on was cancelled: as a task's, the watch is
                self.gone.cancel()
                return
            except (KeyboardInterrupt, SystemExit):
                raise
            except BaseException as e:  # noqa: BLE001 - the watch ends as a task running it would
                self.gone.set_exception(e)
                self.left()
                return
            if getattr(waited, "_asyncio_future_blocking", None):  # a future it waits on: resume once done
                waited._asyncio_future_blocking = False
                waited.add_done_callback(self.step)
            else:  # a bare yield (`asyncio.sleep(0)`): resume on the next iteration
                self.loop.call_soon(self.step)
            return

    def left(self) -> None:
        if self.on_gone is not None:
            self.on_gone()
