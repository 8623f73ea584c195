"""The file descriptors the server may spend on client connections, and the ones it keeps for its own work.

Past its fd limit a process cannot start a sandbox, open a socket into one, open SQLite or run CRIU: the audit
held 21,000 idle connections and `/health` and creates failed. So at start the soft RLIMIT_NOFILE is raised to
the hard one, and client connections may take at most half of what is left once `fd_reserve` is set aside: a
proxied connection holds a second descriptor, its upstream socket into the sandbox. One client address may take a
quarter of them unless told otherwise: enough for a load test's burst, not enough to crowd the others out.
"""

from __future__ import annotations

import resource
from typing import NamedTuple

from gateway._settings import ConnectionLimits

__all__ = ["FdBudget", "fd_budget", "raise_fd_limit"]


class FdBudget(NamedTuple):
    """What `fd_budget` settled on: the process's fd limit and the caps on client connections under it."""

    fd_limit: int
    max_total: int
    max_per_client: int


def raise_fd_limit() -> int:
    """Raise the soft RLIMIT_NOFILE to the hard limit; the limit now in force."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    return hard


def fd_budget(limits: ConnectionLimits, fd_limit: int) -> FdBudget:
    """The connection caps `limits` come to under `fd_limit`; ValueError when the reserve leaves no room."""
    room = fd_limit - limits.fd_reserve
    if room < 2:
        raise ValueError(f"--fd-reserve {limits.fd_reserve} leaves no descriptors for connections (limit {fd_limit})")
    max_total = min(limits.max_connections, room) if limits.max_connections else room // 2
    per_client = limits.max_connections_per_client
    return FdBudget(fd_limit, max_total, max(1, max_total // 4) if per_client is None else per_client)
