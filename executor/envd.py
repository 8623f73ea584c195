"""envd's wire, defined once for the executor that serves it and every client of it (`pool.EnvdClient`).

What is here: the port, the Connect content types and headers, envd's auth headers, the envelope framing,
the size cap of one message, and the messages of the `process.Process` and `filesystem.Filesystem`
services and of `POST /init`, as msgspec Structs. It imports msgspec and the standard library only (the
sandbox image has nothing else) and nothing newer than Python 3.11.2 (Debian's, in the image).

The messages follow the proto3 JSON mapping the SDKs use (e2b-protocol.md §3.4 to §3.6):

* fields are lowerCamelCase on the wire (`Message` sets `rename="camel"`); the few request fields
  whose proto name differs (`watcher_id`, `include_entry`, `allow_network_mounts`) are also
  accepted in snake_case through an explicit second field;
* defaults are omitted on output (`omit_defaults`), which proto3 readers take as the default;
* `bytes` travel as base64 (msgspec's JSON default); int64 `size` is a string on output;
  uint32 inputs may be numbers or strings (`decoder()` is built with `strict=False`);
* enums are their value names on output; `Signal` is also accepted as a number;
* a oneof is a group of optional fields of which exactly one is set; `{}` is an empty message.
"""

from __future__ import annotations

import base64
import struct
from typing import Annotated, TypeVar

import msgspec

__all__ = (
    "ACCESS_TOKEN_HEADER",
    "COMPRESSED",
    "END_STREAM",
    "ENVD_PORT",
    "ENVD_VERSION",
    "ENVELOPE_HEADER",
    "MAX_ARCHIVE_BYTES",
    "MAX_MESSAGE_BYTES",
    "MAX_UPLOAD_BYTES",
    "PROTOCOL_HEADERS",
    "STREAM_TYPE",
    "TIMEOUT_HEADER",
    "UNARY_TYPE",
    "USER_HEADER",
    "DataEvent",
    "Empty",
    "EndEvent",
    "EndOfStream",
    "EntryInfo",
    "EntryResponse",
    "EnvVars",
    "ErrorBody",
    "FilesystemEvent",
    "GetWatcherEventsResponse",
    "InitRequest",
    "ListDirRequest",
    "ListDirResponse",
    "ListResponse",
    "Message",
    "MoveRequest",
    "PathRequest",
    "ProcessConfig",
    "ProcessEvent",
    "ProcessEventResponse",
    "ProcessInfo",
    "ProcessInput",
    "ProcessSelector",
    "Pty",
    "PtySize",
    "SelectorRequest",
    "SendInputRequest",
    "SendSignalRequest",
    "StartEvent",
    "StartRequest",
    "StreamInputData",
    "StreamInputRequest",
    "StreamInputStart",
    "UpdateRequest",
    "WatchDirResponse",
    "WatchRequest",
    "WatcherIdResponse",
    "WatcherRequest",
    "basic_auth",
    "decoder",
    "encode",
    "envelope",
)

M = TypeVar("M", bound="Message")

ENVD_PORT = 49983
"""The executor's port in every sandbox and every runtime: fixed by E2B's envd protocol."""

ENVD_VERSION = "0.6.4"
"""The envd version this executor serves, which the control plane reports as `envdVersion`. The SDKs gate
features on it (e2b-protocol.md §3.10): 0.5.7 octet-stream uploads, 0.6.2 file metadata, 0.6.3 entry info
in watch events, 0.6.4 `allow_network_mounts`. Raise it only with what the newer version serves."""

# Connect (e2b-protocol.md §3.3): unary calls are plain JSON, streams are enveloped JSON.
UNARY_TYPE = "application/json"
STREAM_TYPE = "application/connect+json"
PROTOCOL_HEADERS = {"Connect-Protocol-Version": "1"}
TIMEOUT_HEADER = "Connect-Timeout-Ms"  # the call's deadline; the executor ends it with `deadline_exceeded`

# Who calls: the sandbox's access token (once /init set one), and the user an RPC or /files acts as.
ACCESS_TOKEN_HEADER = "X-Access-Token"
USER_HEADER = "Authorization"

# Envelopes: a flags byte and a big-endian length, then the JSON message.
ENVELOPE_HEADER = struct.Struct(">BI")
COMPRESSED = 0x01
END_STREAM = 0x02  # the last envelope: the trailer, `{}` or `{"error": {...}}`
MAX_MESSAGE_BYTES = 32 * 1024 * 1024  # the largest message the executor reads; larger is `resource_exhausted`

# In the environment of the executor's own helpers (`_as_user`: file operations as a user), as "1": a runtime's
# process census counts them as the executor's, since a restored executor starts them again.
HELPER_ENV = "AGENT_SANDBOX_EXECUTOR_HELPER"

# The executor's default limits (`--max-upload-bytes`, `--max-archive-bytes`): larger is refused with 413.
MAX_UPLOAD_BYTES = 1024**3  # one POST /files body
MAX_ARCHIVE_BYTES = 256 * 1024**2  # one /agent-sandbox/archive, packed or unpacked

# Environment variables as every caller may send them (create's `envVars`, `/init`, `Process/Start`): a name is
# non-empty with no `=` or NUL, a value has no NUL. `execve` cannot pass anything else, so a variable outside
# these is refused where it arrives (400, `invalid_argument`) rather than breaking every later command.
EnvVars = dict[
    Annotated[str, msgspec.Meta(pattern="^[^=\x00]+$", description="non-empty, without `=` or NUL")],
    Annotated[str, msgspec.Meta(pattern="^[^\x00]*$", description="without NUL")],
]


def basic_auth(user: str) -> str:
    """The `Authorization` value naming `user`: Basic with the user and an empty password."""
    return "Basic " + base64.b64encode(f"{user}:".encode()).decode()


def envelope(payload: bytes, flags: int = 0) -> bytes:
    """One message framed as a Connect envelope."""
    return ENVELOPE_HEADER.pack(flags, len(payload)) + payload


class Message(msgspec.Struct, rename="camel", omit_defaults=True):
    """Base of every envd message: camelCase names, defaults left out, unknown fields ignored."""


class Empty(Message):
    """`{}`: the empty responses, `KeepAlive`, `ListRequest` and the WatchDir start event."""


# process.Process


class PtySize(Message):
    cols: int = 0
    rows: int = 0


class Pty(Message):
    size: PtySize | None = None


class ProcessConfig(Message):
    cmd: str = ""
    args: list[str] = []
    envs: EnvVars = {}
    cwd: str | None = None


class ProcessSelector(Message):
    """Oneof: a process by pid or by tag."""

    pid: int | None = None
    tag: str | None = None


class ProcessInput(Message):
    """Oneof: bytes for the stdin pipe or for the PTY."""

    stdin: bytes | None = None
    pty: bytes | None = None


class StartRequest(Message):
    process: ProcessConfig | None = None
    pty: Pty | None = None
    tag: str | None = None
    stdin: bool | None = None  # absent means true (legacy clients); the SDK sends false unless asked


class SelectorRequest(Message):
    """`ConnectRequest` and `CloseStdinRequest`: just a process selector."""

    process: ProcessSelector | None = None


class UpdateRequest(Message):
    process: ProcessSelector | None = None
    pty: Pty | None = None


class SendInputRequest(Message):
    process: ProcessSelector | None = None
    input: ProcessInput | None = None


class SendSignalRequest(Message):
    process: ProcessSelector | None = None
    signal: str | int = 0


class StreamInputStart(Message):
    process: ProcessSelector | None = None


class StreamInputData(Message):
    input: ProcessInput | None = None


class StreamInputRequest(Message):
    """Oneof: the first message names the process, the following ones carry input."""

    start: StreamInputStart | None = None
    data: StreamInputData | None = None
    keepalive: Empty | None = None


class StartEvent(Message):
    pid: int = 0


class DataEvent(Message):
    """Oneof: one chunk of output."""

    stdout: bytes | None = None
    stderr: bytes | None = None
    pty: bytes | None = None


class EndEvent(Message):
    exit_code: int = 0
    exited: bool = False
    status: str = ""
    error: str | None = None


class ProcessEvent(Message):
    """Oneof: start, data, end or keepalive."""

    start: StartEvent | None = None
    data: DataEvent | None = None
    end: EndEvent | None = None
    keepalive: Empty | None = None


class ProcessEventResponse(Message):
    """`StartResponse` and `ConnectResponse`."""

    event: ProcessEvent


class ProcessInfo(Message):
    config: ProcessConfig
    pid: int
    tag: str | None = None


class ListResponse(Message):
    processes: list[ProcessInfo] = []


# filesystem.Filesystem


class EntryInfo(Message):
    """Stat, ListDir, Move, MakeDir and watch events; also each entry of the `POST /files` answer, which is
    envd's REST form of it: name, type "file", path and metadata."""

    name: str
    type: str  # FILE_TYPE_*
    path: str
    size: str = "0"  # int64: a JSON string
    mode: int = 0
    permissions: str = ""
    owner: str = ""
    group: str = ""
    modified_time: str | None = None  # RFC 3339
    symlink_target: str | None = None
    metadata: dict[str, str] = {}  # `user.e2b.*` xattrs (envd 0.6.2; `_metadata`)
    is_symlink: bool = False


class PathRequest(Message):
    """`StatRequest`, `MakeDirRequest` and `RemoveRequest`."""

    path: str = ""


class MoveRequest(Message):
    source: str = ""
    destination: str = ""


class ListDirRequest(Message):
    path: str = ""
    depth: int = 0


class WatchRequest(Message):
    """`WatchDirRequest` and `CreateWatcherRequest`."""

    path: str = ""
    recursive: bool = False
    include_entry: bool = False
    allow_network_mounts: bool = False
    include_entry_snake: bool = msgspec.field(default=False, name="include_entry")
    allow_network_mounts_snake: bool = msgspec.field(default=False, name="allow_network_mounts")

    @property
    def wants_entry(self) -> bool:
        return self.include_entry or self.include_entry_snake


class WatcherRequest(Message):
    """`GetWatcherEventsRequest` and `RemoveWatcherRequest`."""

    watcher_id: str = ""
    watcher_id_snake: str = msgspec.field(default="", name="watcher_id")

    @property
    def id(self) -> str:
        return self.watcher_id or self.watcher_id_snake


class EntryResponse(Message):
    """`StatResponse`, `MakeDirResponse` and `MoveResponse`."""

    entry: EntryInfo


class ListDirResponse(Message):
    entries: list[EntryInfo] = []


class FilesystemEvent(Message):
    name: str
    type: str  # EVENT_TYPE_*
    entry: EntryInfo | None = None


class WatchDirResponse(Message):
    """Oneof: start (always first), filesystem or keepalive."""

    start: Empty | None = None
    filesystem: FilesystemEvent | None = None
    keepalive: Empty | None = None


class WatcherIdResponse(Message):
    """`CreateWatcherResponse`."""

    watcher_id: str


class GetWatcherEventsResponse(Message):
    events: list[FilesystemEvent] = []


# Errors and POST /init


class ErrorBody(msgspec.Struct):
    """A Connect error (a unary call's body, a stream's trailer), or E2B's `{"code": <status>, ...}` of /files."""

    code: str | int = "unknown"
    message: str = ""


class EndOfStream(Message):
    """A stream's trailer: `{}` when it ended cleanly."""

    error: ErrorBody | None = None


class InitRequest(Message):
    """`POST /init`: what the control plane sets in a (possibly warm) sandbox; `None` leaves it as it is."""

    env_vars: EnvVars | None = None
    access_token: str | None = None  # "" removes the token
    default_user: str | None = None
    default_workdir: str | None = None


_encoder = msgspec.json.Encoder()
encode = _encoder.encode


def decoder(message_type: type[M]) -> msgspec.json.Decoder[M]:
    """A reusable decoder that also takes numbers as strings and strings as numbers."""
    return msgspec.json.Decoder(message_type, strict=False)
