"""The one way tests wait for a condition: poll it, bounded in time *and* in count.

* :func:`wait_until` / :func:`wait_until_async`: poll ``check`` until it returns a truthy value
  and return that value. Fails with ``AssertionError("waited for <what>: ...")`` (with the last
  value seen) once ``timeout_s`` passed or ``max_polls`` polls were made, whichever comes first.
  The count bound keeps a loop finite even if a predicate sleeps or a clock stands still.
* :func:`holds_for` / :func:`holds_for_async`: the converse, for "nothing happens": ``check``
  must stay truthy for ``duration_s`` (polled, so a violation is caught while it happens).

The async variants take a predicate that returns a value or an awaitable (for RPC checks).
``procs``: child processes the awaited condition depends on; if one exits, waiting fails at
once with its exit code instead of running into the timeout.
"""

from __future__ import annotations

import asyncio
import inspect
import subprocess
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, TypeVar, overload

T = TypeVar("T")

DEFAULT_TIMEOUT_S = 10.0
DEFAULT_INTERVAL_S = 0.01


def _max_polls(timeout_s: float, interval_s: float, max_polls: int | None) -> int:
    # Twice the polls the time allows (at least 100): the time bound normally ends the loop.
    return max_polls if max_polls is not None else max(100, 2 * int(timeout_s / interval_s))


def _check_alive(procs: Sequence[subprocess.Popen[Any]], what: str) -> None:
    for proc in procs:
        code = proc.poll()
        if code is not None:
            raise AssertionError(f"waited for {what}: {proc.args!r:.120} exited with {code}")


def _failure(what: str, timeout_s: float, polls: int, last: object) -> AssertionError:
    return AssertionError(
        f"waited for {what}: not reached within {timeout_s:g} s ({polls} polls); "
        f"last value {last!r:.300}"
    )


def wait_until(
    check: Callable[[], T],
    what: str,
    *,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    interval_s: float = DEFAULT_INTERVAL_S,
    max_polls: int | None = None,
    procs: Sequence[subprocess.Popen[Any]] = (),
) -> T:
    """Poll ``check`` (blocking) until it is truthy; its value."""
    deadline = time.monotonic() + timeout_s
    limit = _max_polls(timeout_s, interval_s, max_polls)
    last: Any = None
    for polls in range(1, limit + 1):
        last = check()
        if last:
            return last
        _check_alive(procs, what)
        if time.monotonic() >= deadline:
            raise _failure(what, timeout_s, polls, last)
        time.sleep(interval_s)
    raise _failure(what, timeout_s, limit, last)


async def _value(check: Callable[[], T | Awaitable[T]]) -> T:
    value = check()
    if inspect.isawaitable(value):
        return await value
    return value


# Two overloads: with one `T | Awaitable[T]` signature mypy infers T = Never for async checks.
@overload
async def wait_until_async(
    check: Callable[[], Awaitable[T]],
    what: str,
    *,
    timeout_s: float = ...,
    interval_s: float = ...,
    max_polls: int | None = ...,
    procs: Sequence[subprocess.Popen[Any]] = ...,
) -> T: ...
@overload
async def wait_until_async(
    check: Callable[[], T],
    what: str,
    *,
    timeout_s: float = ...,
    interval_s: float = ...,
    max_polls: int | None = ...,
    procs: Sequence[subprocess.Popen[Any]] = ...,
) -> T: ...
async def wait_until_async(
    check: Callable[[], Any],
    what: str,
    *,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    interval_s: float = DEFAULT_INTERVAL_S,
    max_polls: int | None = None,
    procs: Sequence[subprocess.Popen[Any]] = (),
) -> Any:
    """Poll ``check`` (sync or async) without blocking the loop until it is truthy; its value."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    limit = _max_polls(timeout_s, interval_s, max_polls)
    last: Any = None
    for polls in range(1, limit + 1):
        last = await _value(check)
        if last:
            return last
        _check_alive(procs, what)
        if loop.time() >= deadline:
            raise _failure(what, timeout_s, polls, last)
        await asyncio.sleep(interval_s)
    raise _failure(what, timeout_s, limit, last)


def holds_for(
    check: Callable[[], object], what: str, duration_s: float = 0.2, interval_s: float = 0.01
) -> None:
    """``check`` stays truthy for ``duration_s`` (blocking)."""
    end = time.monotonic() + duration_s
    for _ in range(_max_polls(duration_s, interval_s, None)):
        assert check(), f"no longer true: {what}"
        if time.monotonic() >= end:
            return
        time.sleep(interval_s)


async def holds_for_async(
    check: Callable[[], object | Awaitable[object]],
    what: str,
    duration_s: float = 0.2,
    interval_s: float = 0.01,
) -> None:
    """``check`` (sync or async) stays truthy for ``duration_s``, without blocking the loop."""
    loop = asyncio.get_running_loop()
    end = loop.time() + duration_s
    for _ in range(_max_polls(duration_s, interval_s, None)):
        assert await _value(check), f"no longer true: {what}"
        if loop.time() >= end:
            return
        await asyncio.sleep(interval_s)
