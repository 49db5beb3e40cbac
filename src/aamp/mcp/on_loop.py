"""Blocking-style code run on the event loop's own thread, in a greenlet: how the SDK's sync
core (`aamp.client`) acts over the in-process connection (`in_process`) without a thread.

`await run(fn, *args)` calls `fn(*args)` in a new greenlet on the loop's thread; inside it,
`wait(awaitable)` hands the awaitable back to `run`, which awaits it on the loop (other tasks
run meanwhile — the app answering this very request among them) and switches back into `fn`
with its result, or raises its exception there. So `fn` reads as blocking code and costs no
thread hop: on a busy host a hop is the dearest part of a short call (the worker waits for
the loop to give up the GIL, up to the interpreter's 5 ms switch interval, on every
hand-over). Cancelling `run` raises `CancelledError` inside `fn`, whose `finally` blocks run.
(SQLAlchemy's asyncio layer bridges its sync core the same way.)

`fn` may block only through `wait`: a `time.sleep` or blocking I/O in it stops the loop.
"""

from __future__ import annotations

import contextvars
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from greenlet import getcurrent, greenlet

T = TypeVar("T")


class _Bridged(greenlet):  # type: ignore[misc]  # greenlet ships no type information
    """A greenlet started by `run`: only its code may `wait`."""


async def run(fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> T:
    """`fn(*args, **kwargs)`, run on this thread in a greenlet (called as `asyncio.to_thread`)."""
    child = _Bridged(fn)
    child.gr_context = contextvars.copy_context()  # the caller's context, as asyncio.to_thread
    child.parent = getcurrent()
    asked = child.switch(*args, **kwargs)
    while not child.dead:
        try:
            answer = await asked
        except BaseException as exc:  # raised where `fn` waits, whatever it is
            child.parent = getcurrent()
            asked = child.throw(exc)
        else:
            child.parent = getcurrent()  # the loop may step this coroutine in another greenlet
            asked = child.switch(answer)
    return asked  # type: ignore[no-any-return]


def wait(awaitable: Awaitable[T]) -> T:
    """The awaitable's result, awaited on the loop by the `run` that started this code."""
    current = getcurrent()
    if not isinstance(current, _Bridged):
        raise RuntimeError(
            "the in-process connection is used from code that aamp.mcp.on_loop.run did not "
            "start (AsyncClient does; a sync Client over it must be run that way)"
        )
    return current.parent.switch(awaitable)  # type: ignore[no-any-return]
