"""User namespaces that map a whole id range, created by root so root owns them.

Each sandbox gets its own range of 65536 host ids (`slot`): id 0 inside is `BASE + slot * 65536` outside.
Root creating the namespace (rather than the sandbox) is what keeps CRIU working without
CAP_SYS_RESOURCE (`criu-debian.md` §1), and the separate ranges keep sandboxes off each other's files.
"""

from __future__ import annotations

import os

from pool._local._syscalls import CLONE_NEWUSER, unshare

__all__ = ["IDS_PER_SANDBOX", "create_userns", "host_id_base"]

IDS_PER_SANDBOX = 65536
_BASE = 100000


def host_id_base(slot: int) -> int:
    """The host uid/gid that is 0 inside the sandbox using `slot`."""
    return _BASE + slot * IDS_PER_SANDBOX


def create_userns(slot: int) -> int:
    """Create a user namespace for `slot` and return an fd that keeps it alive.

    A forked child unshares and waits; we write its maps (root needs no newuidmap) and open its namespace.
    """
    ready_r, ready_w = os.pipe()
    done_r, done_w = os.pipe()
    pid = os.fork()
    if pid == 0:  # child: only async-signal-safe work until _exit
        try:
            os.close(ready_r)
            os.close(done_w)
            unshare(CLONE_NEWUSER)
            os.write(ready_w, b"1")
            os.read(done_r, 1)
        finally:
            os._exit(0)
    os.close(ready_w)
    os.close(done_r)
    try:
        if os.read(ready_r, 1) != b"1":
            raise OSError("could not create a user namespace")
        base = host_id_base(slot)
        for name in ("uid_map", "gid_map"):
            with open(f"/proc/{pid}/{name}", "w") as f:
                f.write(f"0 {base} {IDS_PER_SANDBOX}\n")
        return os.open(f"/proc/{pid}/ns/user", os.O_RDONLY | os.O_CLOEXEC)
    finally:
        # Wake the child with a byte, not EOF: a child forked meanwhile by another thread holds a copy of
        # `done_w`, so EOF would never come and both children would wait forever.
        os.write(done_w, b"1")
        os.close(ready_r)
        os.close(done_w)
        os.waitpid(pid, 0)
