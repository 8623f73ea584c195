"""The files of templates' COPY steps, uploaded by the E2B Template SDK and kept by content hash.

The SDK asks `GET /templates/{id}/files/{hash}` whether the server has a step's files and, when it has not,
PUTs a tar to the URL the answer gives, without its API key. So the URL authorises itself: it carries an HMAC
of (key, hash) under a secret of this server, and the upload lands in that key's own directory, streamed to
disk up to `MAX_TEMPLATE_FILES_BYTES`, then renamed into place: a half-written upload is never a hash's files.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import os
import secrets
from collections.abc import AsyncIterable
from pathlib import Path

from activator._errors import ActivatorError, InvalidRequest

__all__ = ["MAX_TEMPLATE_FILES_BYTES", "TemplateFiles", "UploadTooLarge"]

MAX_TEMPLATE_FILES_BYTES = 1 << 30  # one COPY step's archive, as uploaded (1 GiB, as envd's file uploads)


class UploadTooLarge(ActivatorError):
    status_code = 413


class TemplateFiles:
    """Uploaded archives under `directory/<key id>/<hash>`, and the tokens of their upload URLs."""

    def __init__(self, directory: Path, *, max_bytes: int = MAX_TEMPLATE_FILES_BYTES) -> None:
        self._directory = directory
        self._max_bytes = max_bytes
        directory.mkdir(parents=True, exist_ok=True, mode=0o700)
        secret_file = directory / ".upload-secret"
        if not secret_file.exists():
            fd = os.open(secret_file, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "wb") as f:
                f.write(secrets.token_bytes(32))
        self._secret = secret_file.read_bytes()

    def path(self, owner: str, files_hash: str) -> Path:
        return self._directory / _safe(owner) / files_hash

    def has(self, owner: str, files_hash: str) -> bool:
        return self.path(owner, files_hash).is_file()

    def token(self, owner: str, files_hash: str) -> str:
        return hmac.new(self._secret, f"{owner}\0{files_hash}".encode(), hashlib.sha256).hexdigest()

    def check(self, owner: str, files_hash: str, token: str) -> bool:
        """Whether an upload URL's `key` and `token` (any text a client sent) are the ones `token` signed."""
        if not (owner.isascii() and token.isascii()):  # never signed; and compare_digest takes ASCII text only
            return False
        return hmac.compare_digest(self.token(owner, files_hash), token)

    async def receive(self, owner: str, files_hash: str, body: AsyncIterable[bytes]) -> int:
        """Stream an upload to disk; its size. UploadTooLarge past the limit (nothing is kept)."""
        target = self.path(owner, files_hash)
        target.parent.mkdir(exist_ok=True, mode=0o700)
        partial = target.with_name(f".{files_hash}.{secrets.token_hex(4)}")
        size = 0
        try:
            with await asyncio.to_thread(open, partial, "wb") as f:
                async for chunk in body:
                    size += len(chunk)
                    if size > self._max_bytes:
                        raise UploadTooLarge(f"a COPY step's files may be at most {self._max_bytes} bytes")
                    f.write(chunk)  # page-cache writes of at most a chunk: not worth a thread hop each
            partial.rename(target)
        finally:
            partial.unlink(missing_ok=True)
        return size


def _safe(owner: str) -> str:
    if not owner or "/" in owner or owner.startswith("."):
        raise InvalidRequest(f"no upload directory for key {owner!r}")
    return owner
