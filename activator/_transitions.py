"""The sandbox state machine as a pure function: `plan(record, intent, now)` says what a transition does.

Intents are a tagged union; `plan` decides the new record and the one runtime action to take, or raises the
`ActivatorError` the client gets. It does no I/O, so every rule here is unit-tested without a runtime; the
machine (`_machine`) carries plans out, one at a time per sandbox.

    intent       running                          paused                          killed / none
    Start        (no change: already started)     (no change)                     start
    Kill         stop -> killed                   stop -> killed                  SandboxNotFound
    Pause        freeze -> paused                 SandboxConflict                 SandboxNotFound
    Resume       extend TTL (or SandboxConflict)  thaw -> running                 SandboxNotFound
    SetTimeout   set / extend TTL                 set / extend remaining TTL      SandboxNotFound
    Expire       kill or pause, once past end_at  (no change: paused time is free) SandboxNotFound
    Reassert     thaw (after a restart)           freeze (after a restart)        SandboxNotFound
"""

from __future__ import annotations

from typing import Literal, NamedTuple

import msgspec
from msgspec.structs import replace

from activator._errors import SandboxConflict, SandboxNotFound
from activator._records import PauseReason, SandboxRecord, SandboxState

__all__ = [
    "Action",
    "Expire",
    "Intent",
    "Kill",
    "Pause",
    "Reassert",
    "Resume",
    "SetTimeout",
    "Start",
    "Step",
    "plan",
]

Action = Literal["start", "stop", "freeze", "thaw"]


class Start(msgspec.Struct, frozen=True, tag=True):
    """Create: start a sandbox for this new record."""

    record: SandboxRecord


class Kill(msgspec.Struct, frozen=True, tag=True):
    """Stop the sandbox for good."""

    reason: str = "killed on request"


class Pause(msgspec.Struct, frozen=True, tag=True):
    """Freeze the sandbox and stop its TTL."""

    reason: PauseReason = "api"


class Resume(msgspec.Struct, frozen=True, tag=True):
    """Thaw a paused sandbox with a TTL of at least `timeout`; on a running one, extend the TTL to `timeout`."""

    timeout: float
    only_if_paused: bool = False  # E2B's v1 resume answers 409 for a running sandbox; connect does not


class SetTimeout(msgspec.Struct, frozen=True, tag=True):
    """Set the TTL to `timeout` seconds from now, or only lengthen it to that when `extend_only`."""

    timeout: float
    extend_only: bool = False


class Expire(msgspec.Struct, frozen=True, tag=True):
    """The reaper saw the deadline pass: kill, or pause per `lifecycle.on_timeout`, if it still has passed."""


class Reassert(msgspec.Struct, frozen=True, tag=True):
    """After a restart, make the processes match the record again (finishing a pause or resume cut short)."""


Intent = Start | Kill | Pause | Resume | SetTimeout | Expire | Reassert


class Step(NamedTuple):
    """The outcome of a plan: the record to store, and the runtime action to take after storing it."""

    record: SandboxRecord
    action: Action | None
    log: str | None  # the lifecycle log line, when something happened worth one


def plan(record: SandboxRecord | None, intent: Intent, now: float) -> Step:
    """What `intent` does to the sandbox whose current record is `record` (None: no such sandbox)."""
    if isinstance(intent, Start):
        new = intent.record
        return Step(record, None, None) if record else Step(new, "start", f"created from template {new.template}")
    if record is None or record.state is SandboxState.KILLED:
        raise SandboxNotFound("sandbox doesn't exist or you don't have access to it")
    match intent:
        case Kill(reason=reason):
            return Step(replace(record, state=SandboxState.KILLED, end_at=now), "stop", reason)
        case Pause(reason=reason):
            return _pause(record, reason, now)
        case Resume(timeout=timeout, only_if_paused=only_if_paused):
            return _resume(record, timeout, only_if_paused, now)
        case SetTimeout(timeout=timeout, extend_only=extend_only):
            return Step(_with_ttl(record, timeout, extend_only, now), None, None)
        case Expire():
            return _expire(record, now)
        case Reassert():
            return Step(record, "freeze" if record.state is SandboxState.PAUSED else "thaw", None)
    raise AssertionError(f"unhandled intent {intent!r}")  # pragma: no cover - the match is exhaustive


def _pause(record: SandboxRecord, reason: PauseReason, now: float) -> Step:
    if record.state is SandboxState.PAUSED:
        raise SandboxConflict(f"sandbox {record.id} is already paused")
    paused = replace(record, state=SandboxState.PAUSED, remaining=max(0.0, record.end_at - now), pause_reason=reason)
    return Step(paused, "freeze", f"paused ({reason})")


def _resume(record: SandboxRecord, timeout: float, only_if_paused: bool, now: float) -> Step:
    if record.state is SandboxState.RUNNING:
        if only_if_paused:
            raise SandboxConflict(f"sandbox {record.id} is already running")
        return Step(_with_ttl(record, timeout, True, now), None, None)
    ttl = max(record.remaining, timeout)
    running = replace(
        record, state=SandboxState.RUNNING, started_at=now, end_at=now + ttl, remaining=0.0, pause_reason=None
    )
    return Step(running, "thaw", f"resumed with {ttl:.0f} s to live")


def _expire(record: SandboxRecord, now: float) -> Step:
    if record.state is not SandboxState.RUNNING or record.end_at > now:
        return Step(record, None, None)
    if record.lifecycle.on_timeout == "pause":
        return _pause(record, "timeout", now)
    return Step(replace(record, state=SandboxState.KILLED, end_at=now), "stop", "killed: its timeout passed")


def _with_ttl(record: SandboxRecord, timeout: float, extend_only: bool, now: float) -> SandboxRecord:
    if record.state is SandboxState.PAUSED:
        remaining = max(record.remaining, timeout) if extend_only else timeout
        return replace(record, remaining=remaining)
    end_at = max(record.end_at, now + timeout) if extend_only else now + timeout
    return replace(record, end_at=end_at)
