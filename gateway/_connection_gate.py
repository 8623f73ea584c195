"""Which client connections the gateway keeps: a cap per client address, a cap in total, and eviction of idle ones.

A connection is *idle* while no request of it is in progress: from its accept (its TLS handshake included) until its
first request head is complete, and between a response and the next complete head (keep-alive). Idle connections
cost a file descriptor and nothing else, so when the total cap is reached a new connection takes the place of the
one idle the longest (Apache's event MPM closes idle keep-alive connections the same way): a flood of idle or slow
(slowloris) connections cannot lock out a client that sends its request when it connects. A connection with a
request in flight (a held request, a stream, a WebSocket) is never evicted. Only when every connection is busy is
the newcomer closed at once.

Past the per-address cap the connection is kept only to answer its request with a 503 (`_guarded_http`), so
the client learns why; it counts in the total, not in its address's share, and is idle until that request.
"""

from __future__ import annotations

import enum
import logging
from typing import Protocol

__all__ = ["Admission", "ConnectionGate", "Evictable"]

_log = logging.getLogger("agent-sandbox")


class Evictable(Protocol):
    def evict(self) -> None:
        """Close the connection now, unanswered."""


class Admission(enum.Enum):
    SERVE = "serve"
    REFUSE = "refuse"  # past its address's cap: answer its request with a 503
    DROP = "drop"  # past the total cap with nothing idle to evict: close it now


class ConnectionGate:
    """Counts open connections per client address and in total, and picks the idle one to evict.

    Used by the event loop's thread only (protocol callbacks), so no lock: every method runs to completion.
    """

    def __init__(self, *, max_total: int, max_per_client: int) -> None:
        if max_total < 1 or max_per_client < 0:
            raise ValueError(
                f"a connection gate needs max_total >= 1 and max_per_client >= 0, not {max_total}, {max_per_client}"
            )
        self.max_total = max_total
        self.max_per_client = max_per_client  # 0: no cap per address
        self._open: dict[Evictable, str | None] = {}  # every counted connection -> its address (None: refused)
        self._per_client: dict[str, int] = {}  # served connections per address, only addresses with some
        self._idle: dict[Evictable, None] = {}  # idle connections, the one idle the longest first
        self._tally = {"refused": 0, "evicted": 0, "dropped": 0}  # since the last `report`

    @property
    def open(self) -> int:
        return len(self._open)

    def admit(self, conn: Evictable, client: str) -> Admission:
        """Count a new connection from `client` (idle until `busy`); DROP means it is not counted."""
        if len(self._open) >= self.max_total:
            if not self._idle:
                self._tally["dropped"] += 1
                return Admission.DROP
            oldest = next(iter(self._idle))
            self.release(oldest)
            oldest.evict()
            self._tally["evicted"] += 1
        served = self._per_client.get(client, 0)
        if self.max_per_client and served >= self.max_per_client:
            self._open[conn] = None
            self._idle[conn] = None
            self._tally["refused"] += 1
            return Admission.REFUSE
        self._open[conn] = client
        self._per_client[client] = served + 1
        self._idle[conn] = None
        return Admission.SERVE

    def idle(self, conn: Evictable) -> None:
        """`conn` has no request in progress any more: it may be evicted, after those idle longer."""
        if conn in self._open:
            self._idle.pop(conn, None)
            self._idle[conn] = None

    def busy(self, conn: Evictable) -> None:
        """`conn` has a request in progress: never evicted until it is idle again."""
        self._idle.pop(conn, None)

    def release(self, conn: Evictable) -> None:
        """`conn` is closed; calling it again (or for a connection never counted) does nothing."""
        self._idle.pop(conn, None)
        client = self._open.pop(conn, None)
        if client is None:
            return
        left = self._per_client[client] - 1
        if left:
            self._per_client[client] = left
        else:
            del self._per_client[client]

    def report(self) -> None:
        """Log what was refused since the last report, if anything (called every few seconds: a flood of
        connections must not flood the log)."""
        if not any(self._tally.values()):
            return
        counts = ", ".join(f"{n} {kind}" for kind, n in self._tally.items() if n)
        _log.warning(
            "client connections: %s (caps: %d in total, %d per address; %d open)",
            counts, self.max_total, self.max_per_client, len(self._open),
        )  # fmt: skip
        self._tally = dict.fromkeys(self._tally, 0)
