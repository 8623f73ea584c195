"""The control plane's request class: a body nested too deeply is the client's mistake, answered 400.

msgspec decodes nesting up to the interpreter's recursion limit (about 1,000 levels; E2B's bodies nest 3) and
raises RecursionError past it, which is no decode error, so Litestar would let it through as a 500.
"""

from __future__ import annotations

from typing import Any

from litestar import Request

from activator._errors import InvalidRequest

__all__ = ["E2bRequest"]


class E2bRequest(Request[Any, Any, Any]):
    """A Litestar request whose JSON body, when nested past the decoder's depth, is an `InvalidRequest`."""

    async def json(self) -> Any:
        try:
            return await super().json()
        except RecursionError as exc:
            raise InvalidRequest("request body: JSON nested too deeply") from exc
