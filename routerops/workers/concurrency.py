"""Per-worker concurrency limit that survives callers running several event loops (asyncio.run twice)."""

from __future__ import annotations

import asyncio


class ConcurrencyLimit:
    """At most `n` holders at a time within the running event loop.

    An asyncio.Semaphore belongs to the loop it first waited in; a worker built once and used from
    successive asyncio.run() calls would then fail. So the semaphore is made anew for each new loop.
    """

    def __init__(self, n: int):
        if n < 1:
            raise ValueError(f"concurrency must be at least 1, got {n}")
        self.n = n
        self._loop: asyncio.AbstractEventLoop | None = None
        self._semaphore: asyncio.Semaphore | None = None

    def _for_running_loop(self) -> asyncio.Semaphore:
        loop = asyncio.get_running_loop()
        if loop is not self._loop or self._semaphore is None:
            self._loop, self._semaphore = loop, asyncio.Semaphore(self.n)
        return self._semaphore

    async def __aenter__(self) -> None:
        await self._for_running_loop().acquire()

    async def __aexit__(self, *exc) -> None:
        self._semaphore.release()
