"""`GET /files` (download) and `POST /files` (upload), e2b-protocol.md §3.1 and §3.2.

Both take the user from `?username=` (else the default user) and accept the access token or a URL
signature. Downloads stream the file, gzip-compressed when the client accepts it and its first 64 KiB
compress (else as they are, with a Content-Length: compressing random bytes only costs CPU). Uploads are
multipart (`file` parts named by their filename, or by `?path=`) or a raw octet-stream body to
`?path=`, optionally `Content-Encoding: gzip`; they are written to disk as they arrive, and the
files of a rejected or failed request are removed, while an old file being replaced survives it
(written beside it, renamed over it once the whole body has arrived: `_fs_ops`). Missing
parent directories are created. Everything created is owned by the user. Every file operation runs
with the named user's rights (`_as_user`): what that user may not read or write is 403, as a shell
of that user gets EACCES; only the bytes themselves are copied by the executor, through the file
descriptor the user's own open() gave. The `X-Metadata-*` headers are every
uploaded file's metadata (`_metadata`: validated before anything is written, then the file's whole
set), and the answer lists each file with the metadata it kept. At most `max_upload_bytes`
(decompressed) are accepted per request: past that the answer is 413 and the rest is not read.
Errors are E2B's JSON `{"code": <status>, "message": "..."}`.
"""

from __future__ import annotations

import logging
import os
import zlib
from collections.abc import AsyncIterator
from typing import BinaryIO

import msgspec

from executor import _fs_ops
from executor._as_user import AsUser
from executor._auth import check_file_access
from executor._defaults import Defaults
from executor._errors import ExecutorError, InvalidArgument, PayloadTooLarge, os_errors
from executor._exchange import Request, Response
from executor._metadata import metadata_from_headers
from executor._multipart import PART_END, MultipartParser, PartStart, boundary_of
from executor._paths import resolve
from executor._users import User, lookup
from executor.envd import EntryInfo

__all__ = ("Files",)

logger = logging.getLogger("executor")

CHUNK = 64 * 1024
JSON = "application/json"


class Files:
    """The /files endpoint."""

    def __init__(self, defaults: Defaults, max_upload_bytes: int, as_user: AsUser) -> None:
        self._defaults = defaults
        self._max_upload_bytes = max_upload_bytes
        self._as_user = as_user

    async def download(self, request: Request, response: Response) -> None:
        try:
            path, user = self._authorize(request, "read")
            opened = await self._as_user.run(user, _fs_ops.open_for_download, path)
        except ExecutorError as exc:
            await response.send_error_json(exc)
            return
        with os.fdopen(opened.fd, "rb") as file:
            await _send_file(file, path, _accepts_gzip(request.headers.get("accept-encoding", "")), response)

    async def upload(self, request: Request, response: Response) -> None:
        try:
            target, user = self._authorize(request, "write")
            metadata = metadata_from_headers(request.headers)
            declared = request.headers.get("content-length", "")
            if declared.isdigit() and int(declared) > self._max_upload_bytes:
                raise PayloadTooLarge(self._too_large())
            body = self._limited(_decoded(request))
            media_type = request.headers.get("content-type", "").split(";", 1)[0].strip().lower()
            if media_type == "application/octet-stream":
                if not request.query.get("path"):
                    raise InvalidArgument("the path query parameter is required for a raw body upload")
                written = [await _Uploads(self._as_user, user, metadata).save(target, body)]
            elif media_type.startswith("multipart/"):
                boundary = boundary_of(request.headers["content-type"])
                written = await self._save_parts(body, boundary, request.query.get("path"), user, metadata)
            else:
                raise InvalidArgument(
                    f"unsupported content type {media_type!r}: use multipart/form-data or application/octet-stream"
                )
        except ExecutorError as exc:
            await response.send_error_json(exc)
            return
        await response.send(200, msgspec.json.encode(written), JSON)

    def _authorize(self, request: Request, operation: str) -> tuple[str, User]:
        query = request.query
        check_file_access(self._defaults, request.headers, query, operation)
        user = lookup(query.get("username") or self._defaults.user)
        return resolve(query.get("path", ""), user, self._defaults.workdir), user

    async def _save_parts(
        self, body: AsyncIterator[bytes], boundary: bytes, query_path: str | None, user: User, metadata: dict[str, str]
    ) -> list[EntryInfo]:
        parser = MultipartParser(boundary)
        uploads = _Uploads(self._as_user, user, metadata)
        async with uploads:
            async for chunk in body:
                for event in parser.feed(chunk):
                    if isinstance(event, PartStart) and event.name == "file":
                        await uploads.open(self._part_path(query_path or event.filename, user, uploads.paths))
                    elif isinstance(event, bytes):
                        uploads.write(event)
                    elif event is PART_END:
                        uploads.close_current()
            parser.close()
            if not uploads.paths:
                raise InvalidArgument("no 'file' part in the multipart body")
            return await uploads.finish()

    def _part_path(self, name: str | None, user: User, written: list[str]) -> str:
        if not name:
            raise InvalidArgument("a 'file' part has no filename and there is no path query parameter")
        path = resolve(name, user, self._defaults.workdir)
        if path in written:
            raise InvalidArgument(f"you cannot upload multiple files to the same path '{path}' in one request")
        return path

    async def _limited(self, chunks: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
        total = 0
        async for chunk in chunks:
            total += len(chunk)
            if total > self._max_upload_bytes:
                raise PayloadTooLarge(self._too_large())
            yield chunk

    def _too_large(self) -> str:
        return f"upload is larger than the limit of {self._max_upload_bytes} bytes"


class _Uploads:
    """The files of one upload request: all put in place by `finish()`, or all abandoned if the request fails."""

    def __init__(self, as_user: AsUser, user: User, metadata: dict[str, str]) -> None:
        self._as_user = as_user
        self._user = user
        self._metadata = metadata
        self._pending: list[_fs_ops.Upload] = []
        self._fd: int | None = None  # of the file being written, the last one opened
        self.paths: list[str] = []  # as the request names them, in the order they came

    async def __aenter__(self) -> _Uploads:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        self.close_current()
        while self._pending:  # not finished: the request failed, and its own error is what the client hears
            upload = self._pending.pop()
            try:
                await self._as_user.run(self._user, _fs_ops.abandon_upload, upload.partial, upload.created)
            except ExecutorError as exc:
                logger.warning("could not remove the temporary file of a failed upload: %s", exc.message)

    async def save(self, path: str, body: AsyncIterator[bytes]) -> EntryInfo:
        """One whole file (a raw body)."""
        async with self:
            await self.open(path)
            async for chunk in body:
                self.write(chunk)
            return (await self.finish())[0]

    async def open(self, path: str) -> None:
        user = self._user
        upload = await self._as_user.run(user, _fs_ops.open_for_upload, path, user.uid, user.gid, self._metadata)
        self._pending.append(upload)
        self.paths.append(path)
        self._fd = upload.fd

    def write(self, data: bytes) -> None:
        if self._fd is None:
            return  # a part that is no file
        view = memoryview(data)
        with os_errors(f"error writing '{self.paths[-1]}'"):
            while view:
                view = view[os.write(self._fd, view) :]

    def close_current(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    async def finish(self) -> list[EntryInfo]:
        """Put every file in place; their entries for the answer."""
        self.close_current()
        written = []
        for upload, path in zip(self._pending, self.paths, strict=True):
            finished = _fs_ops.finish_upload
            written.append(await self._as_user.run(self._user, finished, upload.temporary, upload.destination, path))
        self._pending.clear()
        return written


def _decoded(request: Request) -> AsyncIterator[bytes]:
    """The request body, gunzipped when it says `Content-Encoding: gzip` (checked before any write)."""
    encoding = request.headers.get("content-encoding", "identity").strip().lower()
    if encoding == "identity":
        return request.body.chunks()
    if encoding not in ("gzip", "x-gzip"):
        raise InvalidArgument(f"unsupported Content-Encoding {encoding!r}: use gzip or identity")
    return _gunzip(request.body.chunks())


async def _gunzip(chunks: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
    """Decompress in pieces of at most CHUNK bytes, so a small bomb cannot blow up in memory."""
    decompressor = zlib.decompressobj(16 + zlib.MAX_WBITS)
    try:
        async for chunk in chunks:
            data = decompressor.decompress(chunk, CHUNK)
            while data:
                yield data
                data = decompressor.decompress(decompressor.unconsumed_tail, CHUNK)
        yield decompressor.flush()
    except zlib.error as exc:
        raise InvalidArgument(f"invalid gzip body: {exc}") from exc


_WORTH_COMPRESSING = 0.9
"""A download is gzipped only if its first chunk shrinks below this share of its size."""


async def _send_file(file: BinaryIO, path: str, gzip: bool, response: Response) -> None:
    import mimetypes

    content_type = mimetypes.guess_type(path)[0] or "application/octet-stream"
    headers = (("content-type", content_type), ("content-disposition", _disposition(path)), ("vary", "Accept-Encoding"))
    first = file.read(CHUNK)
    compressor = zlib.compressobj(1, zlib.DEFLATED, 16 + zlib.MAX_WBITS)  # fast: the SDK always asks
    head = compressor.compress(first) + compressor.flush(zlib.Z_SYNC_FLUSH) if gzip and first else b""
    if not head or len(head) > len(first) * _WORTH_COMPRESSING:
        # Identity: not asked for, or the file does not compress (random bytes, images, archives), where gzip
        # would cost the executor's CPU for nothing (16 MiB of random bytes: 350 ms against 20 ms).
        rest = file.read(CHUNK) if len(first) == CHUNK else b""
        size = os.fstat(file.fileno()).st_size
        # A file that fits in what was read has its length; a longer one its size, unless that says nothing
        # (/proc and /sys files report 0, or less than they hold): then chunked, as the gzip answer is.
        length = len(first) if not rest else size if size >= len(first) + len(rest) else None
        await response.start(200, headers, length=length)
        chunk = first
        while chunk:
            await response.write(chunk)
            chunk, rest = rest, (file.read(CHUNK) if rest else b"")
        await response.end()
        return
    await response.start(200, (*headers, ("content-encoding", "gzip")))
    await response.write(head)
    while chunk := file.read(CHUNK):
        await response.write(compressor.compress(chunk))
    await response.write(compressor.flush())
    await response.end()


def _disposition(path: str) -> str:
    from urllib.parse import quote

    name = os.path.basename(path)
    if name.isascii() and name.isprintable() and '"' not in name and "\\" not in name:
        return f'inline; filename="{name}"'
    return f"inline; filename*=UTF-8''{quote(name)}"


def _accepts_gzip(header: str) -> bool:
    for item in header.split(","):
        coding, _, params = item.strip().partition(";")
        if coding.strip().lower() in ("gzip", "*"):
            quality = params.strip().removeprefix("q=").strip() if params.strip().startswith("q=") else "1"
            try:
                return float(quality) > 0
            except ValueError:
                return False
    return False
