"""The client of a sandbox's executor (E2B's envd protocol; its wire is `executor.envd`): `EnvdClient` over an
injected transport, and the HTTP/1.1 exchange over a socket connected into a sandbox that the transports use."""

from executor.envd import ENVD_PORT
from pool._envd._body import BodyReader
from pool._envd._client import EnvdClient, shell_command
from pool._envd._http1 import Connection, Response, exchange
from pool._envd._transport import (
    EnvdTransport,
    KeptAliveTransport,
    Reply,
    SocketOpener,
    SocketTransport,
    one_socket,
)

__all__ = [
    "ENVD_PORT",
    "BodyReader",
    "Connection",
    "EnvdClient",
    "EnvdTransport",
    "KeptAliveTransport",
    "Reply",
    "Response",
    "SocketOpener",
    "SocketTransport",
    "exchange",
    "one_socket",
    "shell_command",
]
