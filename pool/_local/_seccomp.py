"""The seccomp filter every sandbox runs under, as a classic BPF program for `bwrap --seccomp FD`.

Root inside a sandbox holds capabilities in its own user namespace; this filter is what stops it from
creating namespaces, mounting, tracing, loading BPF or kernel modules, using the keyring or userfaultfd. `clone3` gets
ENOSYS (its flags live in memory a filter cannot read), so libc falls back to `clone`, whose namespace
flags are checked. io_uring gets ENOSYS too, as Docker and containerd refuse it (moby#46762: its operations
bypass seccomp and it has a record of kernel escapes); programs that use it (libuv, liburing) fall back to
ordinary system calls when the kernel "has none". Differences from Docker's profile: docs/security.md.
"""

from __future__ import annotations

import errno
import platform
import struct

__all__ = ["seccomp_filter"]

_LD_ABS_W = 0x20
_JEQ_K = 0x15
_JGE_K = 0x35
_JSET_K = 0x45
_RET_K = 0x06
_RET_ALLOW = 0x7FFF0000
_RET_ERRNO = 0x00050000
_X32_BIT = 0x40000000
# CLONE_NEWNS | NEWCGROUP | NEWUTS | NEWIPC | NEWUSER | NEWPID | NEWNET | NEWTIME
_CLONE_NS_FLAGS = 0x00020000 | 0x02000000 | 0x04000000 | 0x08000000 | 0x10000000 | 0x20000000 | 0x40000000 | 0x80

_BLOCKED = (
    "unshare setns mount umount2 pivot_root ptrace process_vm_readv process_vm_writev kexec_load kexec_file_load "
    "bpf perf_event_open open_by_handle_at init_module finit_module delete_module add_key request_key keyctl "
    "open_tree move_mount fsopen fsconfig fsmount fspick mount_setattr reboot swapon swapoff syslog acct userfaultfd"
).split()

# (audit arch, syscall numbers) per machine; the new mount API numbers are shared by all architectures.
_ARCHES: dict[str, tuple[int, dict[str, int]]] = {
    "x86_64": (
        0xC000003E,
        {
            "unshare": 272, "setns": 308, "mount": 165, "umount2": 166, "pivot_root": 155, "ptrace": 101,
            "process_vm_readv": 310, "process_vm_writev": 311, "kexec_load": 246, "kexec_file_load": 320,
            "bpf": 321, "perf_event_open": 298, "open_by_handle_at": 304, "init_module": 175,
            "finit_module": 313, "delete_module": 176, "add_key": 248, "request_key": 249, "keyctl": 250,
            "reboot": 169, "swapon": 167, "swapoff": 168, "syslog": 103, "acct": 163, "clone": 56,
            "userfaultfd": 323,
        },
    ),
    "aarch64": (
        0xC00000B7,
        {
            "unshare": 97, "setns": 268, "mount": 40, "umount2": 39, "pivot_root": 41, "ptrace": 117,
            "process_vm_readv": 270, "process_vm_writev": 271, "kexec_load": 104, "kexec_file_load": 294,
            "bpf": 280, "perf_event_open": 241, "open_by_handle_at": 265, "init_module": 105,
            "finit_module": 273, "delete_module": 106, "add_key": 217, "request_key": 218, "keyctl": 219,
            "reboot": 142, "swapon": 224, "swapoff": 225, "syslog": 116, "acct": 89, "clone": 220,
            "userfaultfd": 282,
        },
    ),
}  # fmt: skip
_SHARED = {"open_tree": 428, "move_mount": 429, "fsopen": 430, "fsconfig": 431, "fsmount": 432, "fspick": 433}
_SHARED_MOUNT_SETATTR = 442
_CLONE3 = 435
_IO_URING = (425, 426, 427)  # io_uring_setup, io_uring_enter, io_uring_register: shared by all architectures


def _insn(code: int, k: int, jt: int = 0, jf: int = 0) -> bytes:
    return struct.pack("<HBBI", code, jt, jf, k)


def seccomp_filter(machine: str | None = None) -> bytes:
    """The filter program for this machine's architecture."""
    arch, numbers = _ARCHES[machine or platform.machine()]
    numbers = {**numbers, **_SHARED, "mount_setattr": _SHARED_MOUNT_SETATTR}
    eperm = _RET_ERRNO | errno.EPERM
    prog = [
        _insn(_LD_ABS_W, 4),  # seccomp_data.arch
        _insn(_JEQ_K, arch, jt=1),
        _insn(_RET_K, eperm),  # foreign ABI (e.g. 32-bit): refuse
        _insn(_LD_ABS_W, 0),  # seccomp_data.nr
    ]
    if arch == _ARCHES["x86_64"][0]:  # x32 syscalls share the arch value; refuse them by number
        prog += [_insn(_JGE_K, _X32_BIT, jf=1), _insn(_RET_K, eperm)]
    for number in (_CLONE3, *_IO_URING):
        prog += [_insn(_JEQ_K, number, jf=1), _insn(_RET_K, _RET_ERRNO | errno.ENOSYS)]
    for name in _BLOCKED:
        prog += [_insn(_JEQ_K, numbers[name], jf=1), _insn(_RET_K, eperm)]
    prog += [
        _insn(_JEQ_K, numbers["clone"], jf=3),
        _insn(_LD_ABS_W, 16),  # low 32 bits of args[0]: the clone flags
        _insn(_JSET_K, _CLONE_NS_FLAGS, jf=1),
        _insn(_RET_K, eperm),
        _insn(_RET_K, _RET_ALLOW),
    ]
    return b"".join(prog)
