"""Pod IPs: one loopback address per pod, so every pod may listen on the same ports as the others.

All of 127.0.0.0/8 reaches the host's loopback on Linux, with no setup. A cluster's pods get 127.<net>.x.y,
`<net>` being the layout's `pod_network` (0 for the default cluster), so two clusters never collide.
"""

from __future__ import annotations

__all__ = ["LoopbackAddresses"]

_PER_BLOCK = 250  # 127.net.N.2 … .251: never .0 or .1 (127.0.0.1, and 127.0.1.1 is the hostname on Debian)
_BLOCKS = 256


class LoopbackAddresses:
    """Hands out 127.<network>.N.M round-robin, so an address just released is not reused at once."""

    def __init__(self, network: int = 0) -> None:
        if not 0 <= network <= 255:
            raise ValueError(f"pod network {network} is not an octet")
        self._network = network
        self._next = 0
        self._used: set[str] = set()

    def allocate(self) -> str:
        for _ in range(_PER_BLOCK * _BLOCKS):
            index, self._next = self._next, (self._next + 1) % (_PER_BLOCK * _BLOCKS)
            address = f"127.{self._network}.{index // _PER_BLOCK}.{index % _PER_BLOCK + 2}"
            if address not in self._used:
                self._used.add(address)
                return address
        raise RuntimeError("every loopback pod address is in use")

    def release(self, address: str) -> None:
        self._used.discard(address)
