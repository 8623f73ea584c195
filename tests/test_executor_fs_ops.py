"""`executor._fs_ops` in this process (uploads: in place, beside and renamed, abandoned) and the helper's wire."""

from __future__ import annotations

import os
import socket
import stat
import struct
import threading
from collections.abc import Iterator
from pathlib import Path

import msgspec
import pytest

from executor import _fs_ops
from executor._errors import InvalidArgument
from executor._fs_worker import FAILED, HEADER, OK, serve

UID, GID = os.getuid(), os.getgid()


def test_a_new_file_is_written_in_place_and_abandoning_removes_it_and_its_directories(tmp_path: Path) -> None:
    path = tmp_path / "made" / "for" / "it.txt"
    upload = _fs_ops.open_for_upload(str(path), UID, GID, {})
    os.write(upload.fd, b"partial")
    os.close(upload.fd)
    assert (upload.temporary, upload.partial) == (None, str(path))
    assert path.read_bytes() == b"partial"
    _fs_ops.abandon_upload(upload.partial, upload.created)
    assert list(tmp_path.iterdir()) == []


def test_an_old_file_keeps_its_content_until_the_upload_finishes_and_keeps_its_mode(tmp_path: Path) -> None:
    path = tmp_path / "script.sh"
    path.write_bytes(b"old")
    path.chmod(0o750)
    upload = _fs_ops.open_for_upload(str(path), UID, GID, {"k": "v"})
    os.write(upload.fd, b"new")
    os.close(upload.fd)
    assert upload.temporary is not None
    assert os.path.dirname(upload.temporary) == str(tmp_path)
    assert path.read_bytes() == b"old"
    entry = _fs_ops.finish_upload(upload.temporary, upload.destination, str(path))
    assert (path.read_bytes(), stat.S_IMODE(path.stat().st_mode)) == (b"new", 0o750)
    assert (entry.name, entry.metadata) == ("script.sh", {"k": "v"})
    assert [child.name for child in tmp_path.iterdir()] == ["script.sh"]


def test_abandoning_an_overwrite_leaves_the_old_file(tmp_path: Path) -> None:
    path = tmp_path / "kept.txt"
    path.write_bytes(b"old")
    upload = _fs_ops.open_for_upload(str(path), UID, GID, {})
    os.write(upload.fd, b"cut sh")
    os.close(upload.fd)
    _fs_ops.abandon_upload(upload.partial, upload.created)
    assert [(child.name, child.read_bytes()) for child in tmp_path.iterdir()] == [("kept.txt", b"old")]


def test_a_link_is_written_through_to_the_file_it_names(tmp_path: Path) -> None:
    (tmp_path / "target.txt").write_bytes(b"old")
    (tmp_path / "link").symlink_to("target.txt")
    upload = _fs_ops.open_for_upload(str(tmp_path / "link"), UID, GID, {})
    os.write(upload.fd, b"new")
    os.close(upload.fd)
    _fs_ops.finish_upload(upload.temporary, upload.destination, str(tmp_path / "link"))
    assert (tmp_path / "link").is_symlink()
    assert (tmp_path / "target.txt").read_bytes() == b"new"


def test_a_fifo_nobody_reads_is_refused_rather_than_waited_for(tmp_path: Path) -> None:
    os.mkfifo(tmp_path / "fifo")
    with pytest.raises(InvalidArgument, match="No such device or address"):
        _fs_ops.open_for_upload(str(tmp_path / "fifo"), UID, GID, {})


def test_a_special_file_is_written_in_place_and_a_directory_refused(tmp_path: Path) -> None:
    upload = _fs_ops.open_for_upload("/dev/null", UID, GID, {})
    os.close(upload.fd)
    assert (upload.temporary, upload.partial, upload.destination) == (None, None, "/dev/null")
    with pytest.raises(InvalidArgument, match="is a directory"):
        _fs_ops.open_for_upload(str(tmp_path), UID, GID, {})


@pytest.fixture(name="helper")
def helper_fixture() -> Iterator[socket.socket]:
    """`serve` on one end of a socketpair, in a thread: what a helper process runs, minus the process."""
    ours, theirs = socket.socketpair()
    thread = threading.Thread(target=serve, args=(theirs,))
    thread.start()
    yield ours
    ours.close()
    thread.join(timeout=10)
    theirs.close()


def _call(sock: socket.socket, name: str, *args: object) -> tuple[int, object, list[int]]:
    request = msgspec.msgpack.encode((name, list(args)))
    sock.sendall(HEADER.pack(OK, len(request)) + request)
    data, ancillary, _, _ = sock.recvmsg(1 << 20, socket.CMSG_SPACE(struct.calcsize("i")))
    fds = [fd for _, _, item in ancillary for fd in struct.unpack(f"{len(item) // 4}i", item)]
    status, length = HEADER.unpack_from(data)
    return status, msgspec.msgpack.decode(data[HEADER.size : HEADER.size + length]), fds


def test_the_helper_sends_an_opened_files_descriptor(helper: socket.socket, tmp_path: Path) -> None:
    (tmp_path / "f").write_bytes(b"content")
    status, _, fds = _call(helper, "open_for_download", str(tmp_path / "f"))
    assert (status, len(fds)) == (OK, 1)
    with os.fdopen(fds[0], "rb") as file:
        assert file.read() == b"content"


def test_the_helper_answers_errors_by_class_name(helper: socket.socket, tmp_path: Path) -> None:
    assert _call(helper, "open_for_download", str(tmp_path / "missing")) == (
        FAILED,
        ["NotFound", f"path '{tmp_path}/missing' does not exist"],
        [],
    )
    status, reply, _ = _call(helper, "no_such_op")
    assert status == FAILED
    assert isinstance(reply, list)
    assert reply[0] == "Internal"
