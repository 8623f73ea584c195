"""The seccomp filter inside a real sandbox: what it refuses, and with which error, for root and for user."""

from __future__ import annotations

import platform
from pathlib import Path

import pytest

from tests.runtime_fixtures import local_runtime, spec
from tests.sandbox_exec import run_in_sandbox

pytestmark = pytest.mark.anyio

# The raw system call, with the errno it failed with: no library in between that could hide the answer.
_SYSCALL = (
    "python3 -c 'import ctypes, sys; libc = ctypes.CDLL(None, use_errno=True); "
    "params = ctypes.create_string_buffer(120); "
    "print(libc.syscall(int(sys.argv[1]), 1, params, 0, 0, 0), ctypes.get_errno())' {number}"
)
_ENOSYS = 38
_EPERM = 1
_USERFAULTFD = {"x86_64": 323, "aarch64": 282}


@pytest.mark.parametrize("user", ["user", "root"])
async def test_io_uring_is_refused_as_if_the_kernel_had_none(tmp_path: Path, user: str) -> None:
    answers = []
    async with local_runtime(tmp_path) as runtime:
        await runtime.start(spec("iouring"))
        for number in (425, 426, 427):  # io_uring_setup, io_uring_enter, io_uring_register
            result = await run_in_sandbox(runtime, "iouring", _SYSCALL.format(number=number), user=user)
            assert result.exit_code == 0, result.stderr
            answers.append(result.stdout.strip())
    assert answers == [f"-1 {_ENOSYS}"] * 3


async def test_userfaultfd_is_refused_like_the_other_kernel_surface(tmp_path: Path) -> None:
    async with local_runtime(tmp_path) as runtime:
        await runtime.start(spec("userfault"))
        result = await run_in_sandbox(
            runtime, "userfault", _SYSCALL.format(number=_USERFAULTFD[platform.machine()]), user="root"
        )
    assert result.stdout.strip() == f"-1 {_EPERM}"
