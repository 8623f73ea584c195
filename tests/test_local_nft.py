"""A sandbox's nftables table is applied through a worker process, whatever the server's descriptor count.

libnftables waits on its netlink socket with select(): in a process holding 1024 descriptors or more, glibc
aborted the whole server ("bit out of range 0 - FD_SETSIZE on fd_set"), as a burst of held requests did.
"""

from __future__ import annotations

import contextlib
import os
import resource
import threading
from collections.abc import Callable, Iterator

import pytest

from pool import RuntimeFailure
from pool._local import _nft
from pool._local._nft import run_nft
from pool._local._syscalls import CLONE_NEWNET, unshare

pytestmark = pytest.mark.sandbox  # real network namespaces and the worker process


@contextlib.contextmanager
def _descriptors_held(count: int) -> Iterator[None]:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, min(hard, count + 512)), hard))
    held = [os.open("/dev/null", os.O_RDONLY) for _ in range(count)]
    try:
        yield
    finally:
        for fd in held:
            os.close(fd)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def _in_a_namespace_of_its_own(work: Callable[[], None]) -> list[BaseException]:
    """Run `work` in a thread that has left for a new, empty network namespace (gone with the thread)."""
    errors: list[BaseException] = []

    def thread() -> None:
        try:
            unshare(CLONE_NEWNET)
            work()
        except BaseException as exc:
            errors.append(exc)

    runner = threading.Thread(target=thread)
    runner.start()
    runner.join()
    return errors


def test_a_table_goes_into_the_calling_threads_namespace_past_1024_descriptors() -> None:
    def create_twice() -> None:
        run_nft("create table inet probe")
        with pytest.raises(RuntimeFailure, match="File exists"):  # it is there: the namespace got it
            run_nft("create table inet probe")

    with _descriptors_held(1100):
        assert _in_a_namespace_of_its_own(create_twice) == []


def test_bad_commands_are_refused_with_nftables_message() -> None:
    def refused() -> None:
        with pytest.raises(RuntimeFailure, match="nftables refused the sandbox's rules: Error"):
            run_nft("add rule inet no-such-table no-such-chain accept")

    assert _in_a_namespace_of_its_own(refused) == []


def test_a_worker_that_died_is_replaced() -> None:
    def create(name: str) -> Callable[[], None]:
        return lambda: run_nft(f"create table inet {name}")

    assert _in_a_namespace_of_its_own(create("first")) == []
    _nft._workers[0].process.kill()
    _nft._workers[0].process.wait()
    assert _in_a_namespace_of_its_own(create("second")) == []
