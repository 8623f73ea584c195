"""The suite's one way to wait for something: poll a condition until it holds, and fail saying what was awaited.

The deadline is generous on purpose: it only bounds a failure, so it must hold on a loaded two-core machine where
a sandbox restore or a server start takes many times longer than on an idle one. Tests never assert how fast
something happened (benchmarks measure that), only that it happened.
"""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar, overload

import pytest

__all__ = ["DEADLINE", "wait_for", "wait_for_async"]

T = TypeVar("T")
DEADLINE = 60.0  # seconds, unless a wait is known to take longer (a cluster's start, a big restore)
_INTERVAL = 0.05


def wait_for(condition: Callable[[], T | None], *, what: str, within: float = DEADLINE) -> T:
    """Call `condition` until it returns something truthy, and return that; fail the test after `within` s.
    (None counts as "not yet", so a condition may return what it found or None.)"""
    deadline = time.monotonic() + within
    while not (result := condition()):
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {within:g} s waiting for {what}")
        time.sleep(_INTERVAL)
    return result


@overload
async def wait_for_async(check: Callable[[], Awaitable[T | None]], *, what: str, within: float = DEADLINE) -> T: ...
@overload
async def wait_for_async(check: Callable[[], T | None], *, what: str, within: float = DEADLINE) -> T: ...
async def wait_for_async(check: Callable[[], object], *, what: str, within: float = DEADLINE) -> object:
    """`wait_for` inside a running event loop, which keeps running between polls; `check` may be a coroutine
    function (awaited each time) or a plain one (what tasks of the test change)."""
    deadline = time.monotonic() + within
    while True:
        result = check()
        if inspect.isawaitable(result):
            result = await result
        if result:
            return result
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {within:g} s waiting for {what}")
        await asyncio.sleep(_INTERVAL)
