"""The sandbox state machine as a pure function: `plan(record, intent, now)` says what a transition does.

Intents are a tagged union; `plan` decides the new record and the one runtime action to take, or raises the
`ActivatorError` the client gets. It does no I/O, so every rule here is unit-tested without a runtime; the
machine (`_machine`) carries plans out, one at a time per sandbox.

States: running, paused (frozen), snapshotted (no process), killed. A paused or snapshotted sandbox has a
reason: `idle` (the idle policy: transparent, the E2B API still says running, its TTL keeps running) or
`api` / `timeout` / `crash` ("user-paused": E2B says paused, its TTL is stopped and kept in `remaining`).

    intent        running                  paused (idle)           snapshotted (idle)      user-paused
    Start         (no change)              (no change)             (no change)             (no change)
    Kill          stop                     stop                    stop                    stop
    Crash         -> user-paused (crash)   -> user-paused (crash)  (no change)             paused: (crash)
    Pause (E2B)   snapshot -> user-paused  snapshot -> user-paused record only (*)         SandboxConflict
    IdleFreeze    freeze -> paused (idle)  (no change)             (no change)             (no change)
    IdleSnapshot  snapshot                 snapshot                (no change)             (no change)
    Resume        extend TTL (v1: 409)     thaw, extend TTL (v1: 409) restore, ditto       thaw / restore
    Wake          (no change)              thaw                    restore                 auto-resume: thaw /
                                                                                           restore; else NotFound
    SetTimeout    end_at                   end_at                  end_at                  remaining
    SetNetwork    egress, set_egress       egress, set_egress      egress                  egress
    Expire        kill, or Pause(timeout)  kill, or Pause(timeout) kill, or Pause(timeout) (no change)
    Reassert      per the runtime's facts after a restart, see `_reassert`

`memory=False` (E2B's `memory: false`) makes a Pause's snapshot keep files only, whatever the runtime could keep
((*): an idle snapshot's memory image is marked to be dropped at the restore), and a Resume of a user-paused
sandbox restore from its files only, dropping a memory image (E2B's cold boot). A Resume of a sandbox the idle
policy paused ignores it: as far as the client knows, that sandbox kept running.

A killed or unknown sandbox is SandboxNotFound for every intent but Start. Expire acts only once `end_at`
has passed; Resume grants `max(remaining, timeout)` to a user-paused sandbox and `max(end_at, now + timeout)`
to any other; Wake keeps the TTL of an idle-paused sandbox as it was (traffic does not lengthen it).
"""

from __future__ import annotations

from typing import Literal, NamedTuple

import msgspec
from msgspec.structs import replace

from activator._errors import SandboxConflict, SandboxNotFound
from activator._records import Egress, SandboxRecord, SandboxState
from pool import ForkImage

__all__ = [
    "Action",
    "Crash",
    "Expire",
    "IdleFreeze",
    "IdleSnapshot",
    "Intent",
    "Kill",
    "Pause",
    "Reassert",
    "Resume",
    "SetNetwork",
    "SetTimeout",
    "Start",
    "Step",
    "Wake",
    "plan",
]

Action = Literal["start", "stop", "freeze", "thaw", "snapshot", "restore", "set_egress"]
_RUNNING, _PAUSED, _SNAPSHOTTED, _KILLED = (
    SandboxState.RUNNING, SandboxState.PAUSED, SandboxState.SNAPSHOTTED, SandboxState.KILLED,
)  # fmt: skip

# What a sandbox whose processes survived a restart needs, by its recorded state (snapshotted: finish the dump).
_REASSERT_ALIVE: dict[SandboxState, Action] = {_RUNNING: "thaw", _PAUSED: "freeze", _SNAPSHOTTED: "snapshot"}


class Start(msgspec.Struct, frozen=True, tag=True):
    """Create: start a sandbox for this new record (with `fork`, as a copy of that image of another sandbox)."""

    record: SandboxRecord
    fork: ForkImage | None = None
    reason = "create"


class Kill(msgspec.Struct, frozen=True, tag=True):
    """Stop the sandbox for good; `reason` is a token for logs (`request`, `exited`, `timeout`, ...)."""

    reason: str = "request"


class Crash(msgspec.Struct, frozen=True, tag=True):
    """The sandbox's processes ended by themselves (its pid 1 died, e.g. to the OOM killer), `why` as the runtime
    saw it: it stays, files only, as if its owner had paused it (the E2B API has no crashed state; a connect
    starts it again over its files), until it is killed."""

    why: str
    reason = "crash"


class Pause(msgspec.Struct, frozen=True, tag=True):
    """E2B's pause: snapshot the sandbox and stop its TTL; with its memory where the runtime can, unless not
    `memory` (E2B's `mode="filesystem"`: its processes are gone for good)."""

    memory: bool = True
    reason = "api"


class IdleFreeze(msgspec.Struct, frozen=True, tag=True):
    """The idle policy: freeze a running sandbox (transparently; its TTL keeps running)."""

    reason = "idle"


class IdleSnapshot(msgspec.Struct, frozen=True, tag=True):
    """The idle policy: scale a running or idle-paused sandbox to zero (transparently)."""

    reason = "idle"


class Resume(msgspec.Struct, frozen=True, tag=True):
    """Connect / resume: bring the sandbox back to running with a TTL of at least `timeout` seconds."""

    timeout: float
    only_if_paused: bool = False  # E2B's v1 resume answers 409 for a sandbox it reports running; connect does not
    memory: bool = True  # False: a user-paused sandbox restarts from its files (E2B's `on_resume="reboot"`)
    reason = "connect"


class Wake(msgspec.Struct, frozen=True, tag=True):
    """Data-plane traffic arrived: resume the sandbox if traffic may wake it."""

    reason = "traffic"


class SetTimeout(msgspec.Struct, frozen=True, tag=True):
    """Set the TTL to `timeout` seconds from now, or only lengthen it to that when `extend_only`."""

    timeout: float
    extend_only: bool = False
    reason = "set-timeout"


class SetNetwork(msgspec.Struct, frozen=True, tag=True):
    """E2B's update_network: replace the egress rules; a sandbox with processes gets them at once, a snapshotted
    one when it is restored (from its record)."""

    egress: Egress
    allow_internet_access: bool | None
    reason = "update-network"


class Expire(msgspec.Struct, frozen=True, tag=True):
    """The reaper saw the deadline pass: kill, or pause per `lifecycle.on_timeout`, if it still has passed."""

    reason = "timeout"


class Reassert(msgspec.Struct, frozen=True, tag=True):
    """After a restart: make record and runtime agree, given whether its processes run and whether it has a snapshot."""

    alive: bool
    snapshotted: bool
    crash: str | None = None  # its processes were found gone and its files kept (the snapshot), and why
    reason = "recover"


Intent = (
    Start
    | Kill
    | Crash
    | Pause
    | IdleFreeze
    | IdleSnapshot
    | Resume
    | Wake
    | SetTimeout
    | SetNetwork
    | Expire
    | Reassert
)


class Step(NamedTuple):
    """The outcome of a plan: the record to store, and the runtime action to take after storing it."""

    record: SandboxRecord
    action: Action | None
    log: str | None  # the lifecycle log line, when something happened worth one
    before: SandboxRecord | None = None  # the record the plan started from
    memory: bool = True  # for a snapshot or restore: False keeps / brings back the files only
    fork: ForkImage | None = None  # for a start: the image the sandbox is a copy of


def plan(record: SandboxRecord | None, intent: Intent, now: float) -> Step:
    """What `intent` does to the sandbox whose current record is `record` (None: no such sandbox)."""
    if isinstance(intent, Start):
        new, fork = intent.record, intent.fork
        if record:
            return _same(record)
        if fork is not None:
            return Step(new, "start", f"forked from sandbox {fork.source_id} (template {new.template})", fork=fork)
        return Step(new, "start", f"created from template {new.template}")
    if record is None or record.state is _KILLED:
        raise SandboxNotFound("sandbox doesn't exist or you don't have access to it")
    step = _plan_live(record, intent, now)
    return step._replace(before=record)


def _plan_live(record: SandboxRecord, intent: Intent, now: float) -> Step:
    match intent:
        case Kill(reason=reason):
            return _kill(record, now, f"killed ({reason})")
        case Crash(why=why):
            return _crash(record, why, now)
        case Pause(memory=memory):
            return _pause(record, "api", now, memory=memory)
        case IdleFreeze():
            return _idle_freeze(record)
        case IdleSnapshot():
            return _idle_snapshot(record)
        case Resume(timeout=timeout, only_if_paused=only_if_paused, memory=memory):
            return _resume(record, timeout, only_if_paused, now, memory=memory)
        case Wake():
            return _wake(record, now)
        case SetTimeout(timeout=timeout, extend_only=extend_only):
            return Step(_with_ttl(record, timeout, extend_only, now), None, None)
        case SetNetwork(egress=egress, allow_internet_access=allow_internet_access):
            changed = replace(record, egress=egress, allow_internet_access=allow_internet_access)
            action: Action | None = "set_egress" if record.state is not _SNAPSHOTTED else None
            return Step(changed, action, "network rules replaced")
        case Expire():
            return _expire(record, now)
        case Reassert(alive=alive, snapshotted=snapshotted, crash=crash):
            return _reassert(record, alive, snapshotted, crash, now)
    raise AssertionError(f"unhandled intent {intent!r}")  # pragma: no cover - the match is exhaustive


def _same(record: SandboxRecord) -> Step:
    return Step(record, None, None)


def _kill(record: SandboxRecord, now: float, log: str) -> Step:
    return Step(replace(record, state=_KILLED, end_at=now), "stop", log)


def _crash(record: SandboxRecord, why: str, now: float) -> Step:
    if record.state is _SNAPSHOTTED:  # its end was a snapshot's after all
        return _same(record)
    remaining = record.remaining if record.user_paused else max(0.0, record.end_at - now)
    crashed = replace(
        record, state=_SNAPSHOTTED, snapshot_kind="filesystem", pause_reason="crash", remaining=remaining, crash=why
    )
    return Step(crashed, None, f"crashed: {why}; its files are kept until it is killed, a connect starts it again")


def _pause(record: SandboxRecord, reason: Literal["api", "timeout"], now: float, *, memory: bool = True) -> Step:
    if record.user_paused:
        raise SandboxConflict(f"sandbox {record.id} is already paused")
    paused = replace(record, state=_SNAPSHOTTED, remaining=max(0.0, record.end_at - now), pause_reason=reason)
    log = f"paused ({reason})" if memory else f"paused ({reason}, files only)"
    if record.state is _SNAPSHOTTED:  # scaled to zero by the idle policy already: only its reason changes
        # A files-only pause marks an idle snapshot's memory image as not to be restored (`_run` drops it).
        return Step(paused if memory else replace(paused, snapshot_kind="filesystem"), None, log)
    # Files only is recorded before the snapshot runs, so a crash mid-way finishes it the same way (`_reassert`).
    promised = paused if memory else replace(paused, snapshot_kind="filesystem")
    return Step(promised, "snapshot", log, memory=memory)


def _idle_freeze(record: SandboxRecord) -> Step:
    if record.state is not _RUNNING:
        return _same(record)
    return Step(replace(record, state=_PAUSED, pause_reason="idle"), "freeze", "paused (idle)")


def _idle_snapshot(record: SandboxRecord) -> Step:
    if record.user_paused or record.state is _SNAPSHOTTED:
        return _same(record)
    return Step(replace(record, state=_SNAPSHOTTED, pause_reason="idle"), "snapshot", "snapshotted (idle)")


def _resume(record: SandboxRecord, timeout: float, only_if_paused: bool, now: float, *, memory: bool) -> Step:
    if record.user_paused:
        ttl = max(record.remaining, timeout)
        log = f"resumed with {ttl:.0f} s to live" + ("" if memory else ", restarted from its files")
        return _run(record, log, end_at=now + ttl, started_at=now, memory=memory)
    if only_if_paused:
        raise SandboxConflict(f"sandbox {record.id} is already running")
    end_at = max(record.end_at, now + timeout)
    if record.state is _RUNNING:
        return Step(replace(record, end_at=end_at), None, None)
    return _run(record, "woken by connect", end_at=end_at, started_at=record.started_at)


def _wake(record: SandboxRecord, now: float) -> Step:
    if record.state is _RUNNING:
        return _same(record)
    if not record.user_paused:
        return _run(record, "woken by traffic", end_at=record.end_at, started_at=record.started_at)
    if not record.lifecycle.auto_resume:
        raise SandboxNotFound(f"The sandbox was not found: {record.id} is paused and does not auto-resume")
    ttl = max(record.remaining, record.timeout)
    return _run(record, f"auto-resumed with {ttl:.0f} s to live", end_at=now + ttl, started_at=now)


def _run(record: SandboxRecord, log: str, *, end_at: float, started_at: float, memory: bool = True) -> Step:
    """Back to running: thaw a frozen sandbox, restore a snapshotted one (from its files only when not `memory`
    or when a files-only pause marked its snapshot so)."""
    action: Action = "thaw" if record.state is _PAUSED else "restore"
    running = replace(
        record, state=_RUNNING, started_at=started_at, end_at=end_at, remaining=0.0, pause_reason=None,
        snapshot_kind=None, crash=None,
    )  # fmt: skip
    return Step(running, action, log, memory=memory and record.snapshot_kind != "filesystem")


def _expire(record: SandboxRecord, now: float) -> Step:
    if record.user_paused or record.end_at > now:
        return _same(record)
    if record.lifecycle.on_timeout == "pause":
        return _pause(record, "timeout", now)
    return _kill(record, now, "killed: its timeout passed")


def _reassert(record: SandboxRecord, alive: bool, snapshotted: bool, crash: str | None, now: float) -> Step:
    """Finish or undo what a crash cut short: the record was stored before its runtime action ran. A sandbox
    that died meanwhile is a crash like one seen live (unless it was being snapshotted: that is its end)."""
    state = record.state
    if alive:  # processes exist: make them frozen or thawed per the record, or finish a snapshot (as it was asked)
        return Step(record, _REASSERT_ALIVE[state], None, memory=record.snapshot_kind != "filesystem")
    if snapshotted and crash is not None:
        if not record.user_paused and record.end_at <= now:  # its time ran out meanwhile: what its lifecycle says
            return _expire(record, now)
        return _crash(record, crash, now)
    if snapshotted:  # no processes but an image: resumable
        if state is _RUNNING:
            return Step(record, "restore", None)  # a restore was cut short: finish it
        return Step(replace(record, state=_SNAPSHOTTED), None, None)
    return _kill(record, now, "killed: its processes were gone after a restart")


def _with_ttl(record: SandboxRecord, timeout: float, extend_only: bool, now: float) -> SandboxRecord:
    if record.user_paused:
        remaining = max(record.remaining, timeout) if extend_only else timeout
        return replace(record, remaining=remaining)
    end_at = max(record.end_at, now + timeout) if extend_only else now + timeout
    return replace(record, end_at=end_at)
