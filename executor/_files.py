"""`GET /files` (download) and `POST /files` (upload), e2b-protocol.md §3.1 and §3.2.

Both take the user from `?username=` (else the default user) and accept the access token or a URL
signature. Downloads stream the file, gzip-compressed when the client accepts it. Uploads are
multipart (`file` parts named by their filename, or by `?path=`) or a raw octet-stream body to
`?path=`, optionally `Content-Encoding: gzip`; they are written to disk as they arrive, into the
destination itself (as envd does: a failed upload leaves a partial file), with missing parent
directories created. Everything created is owned by the user. The `X-Metadata-*` headers are every
uploaded file's metadata (`_metadata`: validated before anything is written, then the file's whole
set), and the answer lists each file with the metadata it kept. At most `max_upload_bytes`
(decompressed) are accepted per request: past that the answer is 413 and the rest is not read.
Errors are E2B's JSON `{"code": <status>, "message": "..."}`.
"""

from __future__ import annotations

import os
import zlib
from collections.abc import AsyncIterator
from typing import BinaryIO

import msgspec

from executor._auth import check_file_access
from executor._defaults import Defaults
from executor._errors import ExecutorError, InvalidArgument, NotFound, PayloadTooLarge, os_errors
from executor._exchange import Request, Response
from executor._metadata import metadata_from_headers, read_metadata, replace_metadata
from executor._multipart import PART_END, MultipartParser, PartStart, boundary_of
from executor._paths import ensure_dirs, resolve
from executor._users import User, lookup
from executor.envd import EntryInfo

__all__ = ("Files",)

CHUNK = 64 * 1024
JSON = "application/json"


class Files:
    """The /files endpoint."""

    def __init__(self, defaults: Defaults, max_upload_bytes: int) -> None:
        self._defaults = defaults
        self._max_upload_bytes = max_upload_bytes

    async def download(self, request: Request, response: Response) -> None:
        try:
            path = self._authorize(request, "read")[0]
            file = _open_for_download(path)
        except ExecutorError as exc:
            await response.send_error_json(exc)
            return
        with file:
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
                written = [await _save(target, body, user, metadata)]
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
        paths: list[str] = []
        fd: int | None = None
        try:
            async for chunk in body:
                for event in parser.feed(chunk):
                    if isinstance(event, PartStart) and event.name == "file":
                        path = self._part_path(query_path or event.filename, user, paths)
                        fd = _open_for_upload(path, user)
                        paths.append(path)
                    elif isinstance(event, bytes) and fd is not None:
                        _write_all(fd, event, paths[-1])
                    elif event is PART_END and fd is not None:
                        replace_metadata(fd, paths[-1], metadata)
                        os.close(fd)
                        fd = None
            parser.close()
        finally:
            if fd is not None:
                os.close(fd)
        if not paths:
            raise InvalidArgument("no 'file' part in the multipart body")
        return [_written(path) for path in paths]

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


async def _save(path: str, body: AsyncIterator[bytes], user: User, metadata: dict[str, str]) -> EntryInfo:
    fd = _open_for_upload(path, user)
    try:
        async for chunk in body:
            _write_all(fd, chunk, path)
        replace_metadata(fd, path, metadata)
    finally:
        os.close(fd)
    return _written(path)


def _open_for_download(path: str) -> BinaryIO:
    with os_errors(f"error opening '{path}'"):
        if not os.path.lexists(path):
            raise NotFound(f"path '{path}' does not exist")
        if os.path.isdir(path):
            raise InvalidArgument(f"path '{path}' is a directory")
        return open(path, "rb")


def _open_for_upload(path: str, user: User) -> int:
    ensure_dirs(os.path.dirname(path), user.uid, user.gid)
    if os.path.isdir(path):
        raise InvalidArgument(f"path is a directory: {path}")
    with os_errors(f"error opening '{path}' for writing"):
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o666)
        try:
            os.fchown(fd, user.uid, user.gid)
        except OSError:
            os.close(fd)
            raise
    return fd


def _write_all(fd: int, data: bytes, path: str) -> None:
    view = memoryview(data)
    with os_errors(f"error writing '{path}'"):
        while view:
            view = view[os.write(fd, view) :]


def _written(path: str) -> EntryInfo:
    """The answer's entry for one file: envd's REST form (type "file"), with the metadata read back from disk."""
    return EntryInfo(os.path.basename(path), "file", path, metadata=read_metadata(path))


async def _send_file(file: BinaryIO, path: str, gzip: bool, response: Response) -> None:
    import mimetypes

    content_type = mimetypes.guess_type(path)[0] or "application/octet-stream"
    headers = (("content-type", content_type), ("content-disposition", _disposition(path)), ("vary", "Accept-Encoding"))
    if not gzip:
        await response.start(200, headers, length=os.fstat(file.fileno()).st_size)
        while chunk := file.read(CHUNK):
            await response.write(chunk)
        await response.end()
        return
    compressor = zlib.compressobj(1, zlib.DEFLATED, 16 + zlib.MAX_WBITS)  # fast: the SDK always asks
    await response.start(200, (*headers, ("content-encoding", "gzip")))
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
