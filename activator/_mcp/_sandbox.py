"""A sandbox as the MCP tools see it: where its ports are served, how a tool call reaches it, how it is described."""

from __future__ import annotations

import socket
from datetime import UTC, datetime
from typing import Any, Literal, Protocol

import msgspec

from activator._activator import Activator
from activator._records import SandboxRecord
from pool import Template

__all__ = ["PortActivator", "SandboxAccess", "SandboxUrls", "describe", "open_port"]

_DEFAULT_PORTS = {"http": 80, "https": 443}


class PortActivator(Protocol):
    """What `open_port` needs of the activator (the MCP server's `Activator`, the web UI's `UiActivator`)."""

    def get(self, owner: str, sandbox_id: str) -> SandboxRecord: ...

    async def connect(self, owner: str, sandbox_id: str, seconds: float) -> tuple[SandboxRecord, bool]: ...

    async def open_upstream(self, sandbox_id: str, port: int) -> socket.socket: ...

    def touch(self, sandbox_id: str) -> None: ...


class SandboxUrls(msgspec.Struct, frozen=True, kw_only=True):
    """Where the gateway serves sandbox ports: `<scheme>://<port>-<id>.<domain>[:<port>]`."""

    domain: str  # ServeSettings.domain
    scheme: Literal["http", "https"] = "http"  # https when the server has a TLS certificate
    port: int | None = None  # the server's port; left out of URLs when it is the scheme's default

    def url(self, sandbox_id: str, port: int | str) -> str:
        suffix = "" if self.port in (None, _DEFAULT_PORTS[self.scheme]) else f":{self.port}"
        return f"{self.scheme}://{port}-{sandbox_id}.{self.domain}{suffix}"


class SandboxAccess:
    """One owner's sandbox, reached by one tool call: it stays theirs, a paused one is woken, use counts as activity."""

    def __init__(self, activator: Activator, owner: str, record: SandboxRecord, template: Template) -> None:
        self.activator = activator
        self.owner = owner
        self.record = record
        self.template = template

    async def connect(self, port: int) -> socket.socket:
        """A socket to `port` in the sandbox, resuming it first if it is paused (as any API call does)."""
        return await open_port(self.activator, self.owner, self.record.id, port)


async def open_port(activator: PortActivator, owner: str, sandbox_id: str, port: int) -> socket.socket:
    """A socket to `port` in `owner`'s sandbox, resuming it first if it is paused; counts as activity."""
    record = activator.get(owner, sandbox_id)  # killed or gone meanwhile: SandboxNotFound
    if not record.wakes_on_traffic:
        # Paused through the API (or by its timeout): a call by its owner resumes it, as E2B's connect does.
        await activator.connect(owner, record.id, record.remaining or record.timeout)
    sock = await activator.open_upstream(record.id, port)
    activator.touch(record.id)
    return sock


def describe(record: SandboxRecord, urls: SandboxUrls, template: Template | None) -> dict[str, Any]:
    """The sandbox as createSandbox, getSandbox and listSandbox return it."""
    described: dict[str, Any] = {
        "sandboxId": record.id,
        "template": record.template,
        "state": record.reported_state.value,  # an idle pause is invisible: such a sandbox reads as running
        "metadata": record.metadata,
        "startedAt": _time(record.started_at),
        "onTimeout": record.lifecycle.on_timeout,
        "urlPattern": urls.url(record.id, "{port}"),
    }
    if record.crash is not None:  # paused by its own crash: a call starts it again over its files
        described["crashed"] = record.crash
    if record.user_paused:
        described["remainingSeconds"] = round(record.remaining)
    else:
        described["endAt"] = _time(record.end_at)
    if template is not None and template.ports:
        described["urls"] = {str(port): urls.url(record.id, port) for port in template.ports}
    return described


def _time(unix: float) -> str:
    return datetime.fromtimestamp(unix, UTC).isoformat(timespec="seconds").replace("+00:00", "Z")
