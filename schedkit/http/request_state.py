"""One generation request as the front end follows it, and the refusal of one it cannot queue."""

from __future__ import annotations

import asyncio

__all__ = ["Overloaded", "RequestState"]


class Overloaded(Exception):
    """A request the front end cannot queue: ``status`` 429 (this key's queue is full) or 503
    (every queue together is full)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


class RequestState:
    """One generation request as the front end follows it: the ids received and not yet
    consumed, and how it ended."""

    __slots__ = (
        "_waiter",
        "cached_tokens",
        "completion_tokens",
        "error",
        "finish",
        "forwarded",
        "ids",
        "key",
        "message",
        "prompt_tokens",
        "rid",
        "stream",
    )

    def __init__(
        self, rid: str, key: str, message: bytes, prompt_tokens: int, stream: bool = True
    ) -> None:
        self.rid = rid
        # A request read as it streams is woken by each output; one read at its end only then.
        self.stream = stream
        self.key = key
        self.message = message
        self.prompt_tokens = prompt_tokens
        self.completion_tokens = 0
        self.cached_tokens = 0
        self.ids: list[int] = []
        self.finish: dict | None = None
        self.error: str | None = None
        self.forwarded = False
        self._waiter: asyncio.Future | None = None

    @property
    def done(self) -> bool:
        """True once the request finished or was refused."""
        return self.finish is not None or self.error is not None

    def take(self) -> list[int]:
        """The ids received since the last call."""
        ids, self.ids = self.ids, []
        return ids

    async def wait(self) -> None:
        """Return once there are new ids or the request is done."""
        if self.ids or self.done:
            return
        self._waiter = asyncio.get_running_loop().create_future()
        try:
            await self._waiter
        finally:
            self._waiter = None

    async def wait_done(self) -> None:
        """Return once the request is done (ids keep accumulating meanwhile)."""
        loop = asyncio.get_running_loop()
        while not self.done:
            self._waiter = loop.create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None

    def wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)
