"""`GET` and `PUT /agent-sandbox/archive`: the sandbox's working directory as one tar.gz, for snapshots.

    GET /agent-sandbox/archive   200 application/gzip, Content-Length, `X-Archive-Root: <directory>`
    PUT /agent-sandbox/archive   204 once the body (such a tar.gz) is unpacked into the same directory

The directory is the default workdir (`defaultWorkdir` of /init), else the executor's current
directory. What goes in and what comes back: `_tar_pack` and `_tar_unpack`. The compressed archive
may be at most `max_bytes` (`--max-archive-bytes`, 256 MiB by default) both ways: past it, 413.

GET packs into an unnamed temporary file before answering, so the response has a Content-Length
and an over-large archive can still get its 413. Packing and unpacking run in a worker thread, so
/health, freeze and thaw keep answering meanwhile, one at a time (a thread lock, so a client that
disconnects cannot let a second one start while its thread still runs). Errors are E2B's JSON.

Unlike `/files`, it names no user and runs with root's rights, on purpose: only the runtime calls it
(the kubernetes runtime's files-only snapshot and its restore, `pool._kube._runtime`), and what it
carries is the whole directory as it is, every owner, mode and xattr kept, which no one user could
read or put back. It takes the envd access token, whose holder may run any command as root anyway.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import tempfile
import threading
from typing import BinaryIO

from executor._defaults import Defaults
from executor._errors import ExecutorError, NotFound, PayloadTooLarge, os_errors
from executor._exchange import Request, Response

__all__ = ("Archives",)

CHUNK = 256 * 1024


class Archives:
    """The archive endpoint of one executor."""

    def __init__(self, defaults: Defaults, max_bytes: int) -> None:
        self._defaults = defaults
        self._max_bytes = max_bytes
        self._busy = threading.Lock()  # held by the worker thread that packs or unpacks

    def root(self) -> str:
        """The directory archived and restored."""
        return os.path.abspath(self._defaults.workdir or os.getcwd())

    async def download(self, request: Request, response: Response) -> None:
        root = self.root()
        try:
            file, size = await asyncio.to_thread(self._pack, root)
        except ExecutorError as exc:
            await response.send_error_json(exc)
            return
        headers = (("content-type", "application/gzip"), ("x-archive-root", _header_value(root)))
        with file:
            await response.start(200, headers, length=size)
            while chunk := file.read(CHUNK):
                await response.write(chunk)
            await response.end()

    async def upload(self, request: Request, response: Response) -> None:
        try:
            declared = request.headers.get("content-length", "")
            if declared.isdigit() and int(declared) > self._max_bytes:
                raise PayloadTooLarge(self._too_large())
            file = await self._spool(request)
            await asyncio.to_thread(self._unpack, file, self.root())
        except ExecutorError as exc:
            await response.send_error_json(exc)
            return
        await response.send(204)

    async def _spool(self, request: Request) -> BinaryIO:
        """The request body in a temporary file, rewound; the caller closes it."""
        with contextlib.ExitStack() as cleanup:
            file = cleanup.enter_context(tempfile.TemporaryFile())
            size = 0
            async for chunk in request.body.chunks():
                size += len(chunk)
                if size > self._max_bytes:
                    raise PayloadTooLarge(self._too_large())
                file.write(chunk)
            file.seek(0)
            cleanup.pop_all()
        return file

    def _pack(self, root: str) -> tuple[BinaryIO, int]:
        """In a worker thread: the archive of `root` in a temporary file, rewound, and its size."""
        from executor._tar_pack import pack

        with self._busy, os_errors(f"error archiving '{root}'"):
            if not os.path.isdir(root):
                raise NotFound(f"the working directory '{root}' does not exist")
            with contextlib.ExitStack() as cleanup:
                file = cleanup.enter_context(tempfile.TemporaryFile())
                size = pack(root, file, self._max_bytes)
                file.seek(0)
                cleanup.pop_all()
            return file, size

    def _unpack(self, file: BinaryIO, root: str) -> None:
        """In a worker thread: unpack `file` (closed afterwards) into `root`."""
        from executor._tar_unpack import unpack

        with file, self._busy, os_errors(f"error restoring the archive into '{root}'"):
            unpack(file, root)

    def _too_large(self) -> str:
        return f"the archive is larger than the limit of {self._max_bytes} bytes"


def _header_value(text: str) -> str:
    """A header carries latin-1: a path's UTF-8 bytes go out as they are."""
    return text.encode("utf-8", "surrogateescape").decode("latin-1")
