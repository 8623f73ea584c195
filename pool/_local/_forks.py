"""The disk side of forks: an image of a running sandbox (CRIU's, plus its writable layer), and a fork's copy of it.

The image is taken with the source frozen throughout, so that its memory and its files are of the same moment:
CRIU dumps it with `--leave-running` (`checkpoint`), its writable layer is copied, and it is thawed. A fork is a
new sandbox (`LocalSandboxes._prepare`: directory, uid slot, cgroups, disk) whose writable layer becomes a copy
of the image's with the source's host ids moved to the fork's (`shift_ids`), and whose memory image is the
source's, hard-linked (CRIU only reads it), with its user namespace moved the same way (`_criu_userns`). A
restore into it then is an ordinary restore (`restore`).
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import subprocess
import time
from pathlib import Path

import msgspec

from pool._errors import RuntimeFailure
from pool._local._criu import CriuBinary
from pool._local._criu_sandbox import checkpoint
from pool._local._criu_userns import move_user_namespace
from pool._local._id_shift import shift_ids
from pool._local._sandbox import Sandbox
from pool._local._userns import host_id_base
from pool._templates import Resources

__all__ = ["ForkSource", "keep_memory_image", "kept_memory_image", "place_fork", "take_fork_image"]

_SOURCE = "source.json"  # a kept image's `ForkSource`


class ForkSource(msgspec.Struct, frozen=True, kw_only=True):
    """What a fork takes from its source besides the image: the source's host ids, layers and start pids."""

    id_base: int
    layers: tuple[str, ...]
    start_pids: tuple[int, ...]
    seconds: float  # how long the source was frozen
    image_bytes: int
    # The token the image's executor holds, for a kept image (a snapshot with memory); a fork's is its `ForkImage`'s.
    access_token: str | None = None
    # The source's limits: its memory must fit a copy's cgroup (a template's may have changed since it started).
    resources: Resources | None = None


def take_fork_image(criu: CriuBinary, box: Sandbox, directory: Path) -> ForkSource:
    """Dump the running sandbox `box` into `directory` (its memory in `checkpoint/`, its writable layer in
    `upper/`), frozen meanwhile; it runs on as it was (blocking). On failure `directory` is removed."""
    directory.mkdir(parents=True, mode=0o700)
    try:
        was_frozen = box.cgroup.is_frozen()
        started = time.monotonic()
        try:
            box.cgroup.freeze()
            info = checkpoint(
                criu, sandbox_dir=directory, pid=box.pid, freezer=box.cgroup.freezer_path(), leave_running=True
            )
            upper = (box.directory / "upper").resolve()
            subprocess.run(["cp", "-a", "--", str(upper), str(directory / "upper")], check=True, capture_output=True)
        finally:
            if not was_frozen:  # also after a freeze that timed out: it may have frozen it all the same
                with contextlib.suppress(OSError, RuntimeFailure):  # its pid 1 died meanwhile: its cgroup is gone
                    box.cgroup.thaw()
        seconds = time.monotonic() - started
        layers = tuple(str(layer) for layer in box.layers())
    except subprocess.CalledProcessError as exc:
        shutil.rmtree(directory, ignore_errors=True)
        why = exc.stderr.decode(errors="replace").strip()
        raise RuntimeFailure(f"the files of sandbox {box.sandbox_id} could not be copied: {why}") from exc
    except OSError as exc:
        shutil.rmtree(directory, ignore_errors=True)
        raise RuntimeFailure(f"sandbox {box.sandbox_id} could not be imaged: {exc}") from exc
    except BaseException:
        shutil.rmtree(directory, ignore_errors=True)
        raise
    return ForkSource(
        id_base=host_id_base(box.slot), layers=layers, start_pids=tuple(box.start_pids()), seconds=seconds,
        image_bytes=info.image_bytes, resources=box.resources,
    )  # fmt: skip


def keep_memory_image(criu: CriuBinary, box: Sandbox, directory: Path, access_token: str | None) -> ForkSource:
    """`take_fork_image` for a snapshot with memory, which outlives its source: its ids moved to the canonical range
    (so that it is no sandbox's once the source's slot is reused) and its `ForkSource` written beside it, root's
    alone (it holds the executor's token). On failure `directory` is removed (blocking)."""
    source = take_fork_image(criu, box, directory)
    try:
        shift_ids(directory / "upper", source.id_base, 0)
        move_user_namespace(directory / "checkpoint", source.id_base, 0)
        kept = msgspec.structs.replace(source, id_base=0, access_token=access_token)
        fd = os.open(directory / _SOURCE, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "wb") as out:
            out.write(msgspec.json.encode(kept))
    except BaseException:
        shutil.rmtree(directory, ignore_errors=True)
        raise
    return kept


def kept_memory_image(directory: Path) -> ForkSource:
    """The `ForkSource` of the image `keep_memory_image` kept in `directory`; RuntimeFailure when it is gone."""
    try:
        return msgspec.json.decode((directory / _SOURCE).read_bytes(), type=ForkSource)
    except (OSError, msgspec.DecodeError) as exc:
        raise RuntimeFailure(f"the memory image {directory.name} is gone or unreadable: {exc}") from exc


def place_fork(directory: Path, source: ForkSource, box: Sandbox) -> None:
    """Make the prepared sandbox `box` a copy of the image in `directory`: its writable layer the image's, its
    `checkpoint/` the image's memory, both moved to its own host ids (blocking)."""
    base = host_id_base(box.slot)
    upper = (box.directory / "upper").resolve()
    try:
        for entry in os.scandir(upper):  # what `_prepare` wrote there is in the image's layer too
            if entry.is_dir(follow_symlinks=False):
                shutil.rmtree(entry.path)
            else:
                os.unlink(entry.path)
        subprocess.run(["cp", "-a", "--", f"{directory / 'upper'}/.", str(upper)], check=True, capture_output=True)
        shift_ids(upper, source.id_base, base)
        images = box.directory / "checkpoint"
        images.mkdir(mode=0o700)
        for entry in os.scandir(directory / "checkpoint"):
            _link_or_copy(Path(entry.path), images / entry.name)
        move_user_namespace(images, source.id_base, base)
    except subprocess.CalledProcessError as exc:
        why = exc.stderr.decode(errors="replace").strip()
        raise RuntimeFailure(f"the files of fork {box.sandbox_id} could not be copied: {why}") from exc
    except OSError as exc:
        raise RuntimeFailure(f"fork {box.sandbox_id} could not be made: {exc}") from exc


def _link_or_copy(source: Path, target: Path) -> None:
    try:
        os.link(source, target)
    except OSError as exc:
        if exc.errno != errno.EXDEV:
            raise
        shutil.copy2(source, target)
