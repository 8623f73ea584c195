"""The edge: the ASGI app, host/header routing, the HTTP and WebSocket proxy into sandboxes, and the web UI.

Other packages import only the names listed here. `serve` and `cleanup` are loaded on first use (PEP 562): they
bring in the whole server (Litestar, uvicorn, every runtime; `python -X importtime` measured 1.3-1.9 s against
0.25 s for all of `import cli`), which `agent-sandbox deploy`, `keys` and `--help` do not need; the settings they
take are all the CLI needs to parse its flags.
"""

import typing

from gateway._settings import ConnectionLimits, ServeSettings

if typing.TYPE_CHECKING:
    from gateway._serve import cleanup, serve

__all__ = ["ConnectionLimits", "ServeSettings", "cleanup", "serve"]

_ON_FIRST_USE = frozenset({"cleanup", "serve"})


def __getattr__(name: str) -> object:
    if name not in _ON_FIRST_USE:
        raise AttributeError(f"module 'gateway' has no attribute {name!r}")
    from gateway import _serve

    return getattr(_serve, name)
