"""Allocation of per-sandbox uid ranges, machine-wide, so two servers never hand out the same range."""

from __future__ import annotations

import os
import random
from pathlib import Path

from pool._errors import RuntimeFailure

__all__ = ["SlotAllocator"]

_SLOTS = 30000  # 100000 + 30000 * 65536 stays below 2**31


class SlotAllocator:
    """A slot is taken by creating `<dir>/<slot>` exclusively; the file names the sandbox holding it."""

    def __init__(self, directory: Path) -> None:
        self._dir = directory
        directory.mkdir(parents=True, exist_ok=True)

    def take(self, owner: str) -> int:
        for _ in range(100):
            slot = random.randrange(1, _SLOTS)
            try:
                fd = os.open(self._dir / str(slot), os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            except FileExistsError:
                continue
            with os.fdopen(fd, "w") as f:
                f.write(owner)
            return slot
        raise RuntimeFailure("no free uid range for a new sandbox")

    def release(self, slot: int) -> None:
        (self._dir / str(slot)).unlink(missing_ok=True)
