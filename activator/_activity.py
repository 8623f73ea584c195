"""What the idle policy knows about a sandbox's traffic: when it last saw some, and whether any is in flight.

Activity is kept in memory only (never a store write per request): after a restart every sandbox counts as
active from that moment on, which only delays the next idle pause. With several replicas each one's touches
go to the others through the coordinator, batched (`on_touch`), and the leader's reaper `merge`s them.

A sandbox is busy while a data-plane open is under way for it (held or connecting) or while a socket the
gateway opened into it is still open: an in-flight request, a streaming response (a running command's
output), an open WebSocket, or an idle keep-alive connection (which `Activator` has the gateway drop first).
"""

from __future__ import annotations

import contextlib
import socket
import weakref
from collections.abc import Callable, Collection, Iterator, Mapping

__all__ = ["Activity"]


class Activity:
    """Per-sandbox traffic facts. Touched on every proxied request; all on the event loop, so no locks."""

    def __init__(self, clock: Callable[[], float], *, on_touch: Callable[[str, float], None] | None = None) -> None:
        """`on_touch(sandbox_id, at)` hears every touch (the coordinator batches them to the other replicas)."""
        self._clock = clock
        self._on_touch = on_touch
        self._last: dict[str, float] = {}  # id -> clock time of the last request or frame; written by `touch`
        self._opening: dict[str, int] = {}  # id -> `open_upstream` calls in progress; the opener's context manager
        # id -> sockets handed to the gateway; weak, so a closed and dropped socket leaves by itself
        self._sockets: dict[str, weakref.WeakSet[socket.socket]] = {}

    def touch(self, sandbox_id: str) -> None:
        """Traffic just now."""
        now = self._last[sandbox_id] = self._clock()
        if self._on_touch is not None:
            self._on_touch(sandbox_id, now)

    def merge(self, seen: Mapping[str, float]) -> None:
        """Take in the last traffic other replicas saw (the newer time wins)."""
        for sandbox_id, at in seen.items():
            if at > self._last.get(sandbox_id, 0.0):
                self._last[sandbox_id] = at

    def touch_busy(self) -> None:
        """Touch every busy sandbox: a long request or WebSocket on this replica keeps it active for the others."""
        for sandbox_id in {*self._opening, *self._sockets}:
            if self.busy(sandbox_id):
                self.touch(sandbox_id)

    def last(self, sandbox_id: str) -> float:
        """Clock time of the last traffic, 0 when none was seen since the start."""
        return self._last.get(sandbox_id, 0.0)

    @contextlib.contextmanager
    def opening(self, sandbox_id: str) -> Iterator[None]:
        """Count an open (held or connecting) for as long as the block runs."""
        self._opening[sandbox_id] = self._opening.get(sandbox_id, 0) + 1
        try:
            yield
        finally:
            left = self._opening[sandbox_id] - 1
            if left:
                self._opening[sandbox_id] = left
            else:
                del self._opening[sandbox_id]

    def opened(self, sandbox_id: str, sock: socket.socket) -> None:
        """The gateway got `sock` into the sandbox; the sandbox is busy until it closes."""
        sockets = self._sockets.get(sandbox_id)
        if sockets is None:
            sockets = self._sockets[sandbox_id] = weakref.WeakSet()
        sockets.add(sock)

    def busy(self, sandbox_id: str) -> bool:
        """Whether an open is under way or a socket into the sandbox is still open."""
        if self._opening.get(sandbox_id):
            return True
        return any(sock.fileno() != -1 for sock in self._sockets.get(sandbox_id, ()))

    def prune(self, live: Collection[str]) -> None:
        """Forget sandboxes that are gone, and sockets that are closed (the reaper calls this every pass)."""
        self._last = {i: t for i, t in self._last.items() if i in live}
        for sandbox_id in list(self._sockets):
            sockets = self._sockets[sandbox_id]
            for sock in [s for s in sockets if s.fileno() == -1]:
                sockets.discard(sock)
            if sandbox_id not in live or not sockets:
                del self._sockets[sandbox_id]
