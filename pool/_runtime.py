"""The interface every runtime implements (`local` here, `kubernetes` later) and the types it speaks."""

from __future__ import annotations

import dataclasses
import ipaddress
import socket
from collections.abc import Callable
from pathlib import Path
from typing import Literal, Protocol

import msgspec

from pool._templates import Template
from pool._volumes import VolumeMount

__all__ = [
    "ALL_TRAFFIC",
    "BuildLog",
    "EgressRules",
    "ExecutorInit",
    "ForkImage",
    "Forker",
    "RegistryLogin",
    "Runtime",
    "RuntimeCapabilities",
    "SandboxSpec",
    "SandboxStats",
    "SnapshotInfo",
    "SnapshotKind",
    "TemplateBuilder",
]

SnapshotKind = Literal["criu", "filesystem"]


class ExecutorInit(msgspec.Struct, rename="camel", omit_defaults=True, kw_only=True):
    """What the control plane applies to a sandbox's executor (envd's `POST /init`), also on warm claims."""

    env_vars: dict[str, str] = {}
    access_token: str | None = None
    default_user: str | None = None
    default_workdir: str | None = None


ALL_TRAFFIC = ("0.0.0.0/0", "::/0")  # what `allow_internet_access=false` denies (E2B's ALL_TRAFFIC, both families)


class EgressRules(msgspec.Struct, frozen=True, kw_only=True):
    """What a sandbox may reach outside itself, as E2B's API states it (already validated by the API).

    `allow_out` holds IPs, CIDRs and domains (`example.com`, `*.example.com`); `deny_out` IPs and CIDRs only.
    Allow beats deny beats the default, which is allowed. Whatever the rules say, private and link-local ranges,
    the host's own addresses, the control plane and other sandboxes stay unreachable. `EgressRules()` is E2B's
    default: the internet, nothing private.
    """

    allow_out: tuple[str, ...] = ()
    deny_out: tuple[str, ...] = ()

    @property
    def internet(self) -> bool:
        """Whether anything outside may be reached at all (False: `allow_internet_access=false` and no allow)."""
        return bool(self.allow_out) or not set(ALL_TRAFFIC) <= set(self.deny_out)

    @property
    def domains(self) -> tuple[str, ...]:
        """The entries of `allow_out` that are names rather than IPs or CIDRs."""
        return tuple(entry for entry in self.allow_out if not _is_network(entry))

    @property
    def allowed_networks(self) -> tuple[str, ...]:
        """The entries of `allow_out` that are IPs or CIDRs."""
        return tuple(entry for entry in self.allow_out if _is_network(entry))


def _is_network(entry: str) -> bool:
    try:
        ipaddress.ip_network(entry, strict=False)
    except ValueError:
        return False
    return True


@dataclasses.dataclass(frozen=True)
class ForkImage:
    """A running sandbox's memory and files of one moment, which its forks start from (`Forker`); in memory only."""

    source_id: str
    key: str  # what the runtime finds the image by
    # The source executor's token at that moment, which the image's executor still holds: a fork's `/init`
    # authenticates with it to set the fork's own (the repr hides it).
    access_token: str | None = dataclasses.field(default=None, repr=False)
    seconds: float = 0.0  # how long the source was held for it
    image_bytes: int = 0


class SandboxSpec(msgspec.Struct, frozen=True, kw_only=True):
    """Everything a runtime needs to start one sandbox."""

    sandbox_id: str
    template: Template
    init: ExecutorInit
    egress: EgressRules = EgressRules()
    # Extra annotations for the runtime's objects (owner key id, metadata, lifecycle); never secrets.
    annotations: dict[str, str] = {}
    volumes: tuple[VolumeMount, ...] = ()  # mounted read-write at their paths (runtimes with `volumes` only)
    fork: ForkImage | None = None  # start as a copy of that image, memory and all (runtimes that are `Forker`s)


class SandboxStats(msgspec.Struct, frozen=True, kw_only=True):
    """Resource figures read from the sandbox's cgroups and its writable layer."""

    cpu_count: int
    cpu_used_pct: float
    cpu_seconds: float
    mem_used: int
    mem_total: int
    mem_cache: int
    disk_used: int
    disk_total: int


class SnapshotInfo(msgspec.Struct, frozen=True, kw_only=True):
    """A finished snapshot: what it keeps, how long taking it took, and the disk it holds."""

    kind: SnapshotKind  # "criu": processes and memory kept; "filesystem": files only, start commands re-run
    seconds: float  # from the call until no process of the sandbox was left
    image_bytes: int  # the memory image (criu) plus the writable layer, in bytes on disk


class RuntimeCapabilities(msgspec.Struct, frozen=True, kw_only=True):
    """What the runtime can do on this machine, for the health details and `agent-sandbox doctor`."""

    snapshot_kind: SnapshotKind  # what a snapshot keeps here
    criu_version: str = ""  # the CRIU that passed the start-up trial; "" when none did
    criu_reason: str = ""  # why snapshots keep files only ("" when CRIU works)
    # Why `EgressRules.domains` are refused here ("" when enforced): the activator answers a create or update
    # naming any with this, instead of accepting rules nothing enforces. IPs and CIDRs every runtime enforces.
    domain_refusal: str = ""


BuildLog = Callable[[int | None, str, str], None]
"""Where a template build reports: (index of the layer in `Template.layers`, or None for the build as a whole;
level: "debug" | "info" | "warn" | "error"; one line of text)."""


@dataclasses.dataclass(frozen=True)
class RegistryLogin:
    """A registry's username and password for the pull of one build's base image (E2B's `fromImageRegistry`);
    held in memory for that build only, never in a template, a record or a log (the repr hides the password)."""

    username: str
    password: str = dataclasses.field(repr=False)


class TemplateBuilder(Protocol):
    """Builds templates on a runtime that can (the local one): every missing layer, then a trial start."""

    async def build_template(
        self,
        template: Template,
        log: BuildLog,
        *,
        files: Callable[[str], Path],
        within: float,
        registry: RegistryLogin | None = None,
    ) -> Template:
        """Build `template`'s missing layers, each sandboxed one in a build sandbox of its own with egress, then
        start it once to see its start and ready commands succeed; the template as built (what a runtime pins
        while building, e.g. an image's digest, filled in), which is what its sandboxes must start from.
        `files(hash)` is the archive a `CopyLayer` names; `within` bounds the whole build in seconds; `registry`
        logs in to pull an `OciLayer`'s image. TemplateBuildFailed names the layer that failed."""

    async def snapshot_files(self, sandbox_id: str, template: Template, name: str) -> Template:
        """A template `name` whose sandboxes start over the running sandbox's files as they are now: `template`
        (the one it runs) with a `SnapshotLayer` of its writable layer on top. The sandbox is frozen only while
        its files are copied, and runs on as it was. SandboxGone when it does not run."""

    async def snapshot_memory(
        self, sandbox_id: str, template: Template, name: str, access_token: str | None
    ) -> Template:
        """A template `name` whose sandboxes go on from the running sandbox's memory and files as they are now:
        `template` (the one it runs) naming a memory image of it (`Template.memory_image`), which `start` restores
        into each as a fork. `access_token` is its executor's. The sandbox is frozen only while the image is
        taken. SandboxGone when it does not run, RuntimeFailure when the dump fails."""

    async def forget_memory_images(self, keep: set[str]) -> None:
        """Remove every memory image but those in `keep` (the ones the stored snapshots name): a crash between
        taking one and recording its snapshot leaves one that nothing names."""

    async def drop_snapshot_files(self, template: Template) -> None:
        """Delete the files its snapshot took: the `SnapshotLayer` on top of `template` (those below are other
        snapshots'), or its memory image; no sandbox or template may start from them again."""

    async def snapshot_bytes(self, template: Template) -> int:
        """Bytes on disk of the files its snapshot took (what `drop_snapshot_files` would free); 0 for a template
        that is no snapshot."""


class Forker(Protocol):
    """Forks running sandboxes with their memory (the local runtime, where CRIU works): one image of the source,
    then each fork a `start` with `SandboxSpec.fork` naming it, restored into a sandbox of its own (its own id
    range, network namespace, cgroups and executor token)."""

    async def fork_refusal(self) -> str:
        """Why forks cannot be made here ("" when they can)."""

    async def fork_image(self, sandbox_id: str, access_token: str | None) -> ForkImage:
        """An image of the running sandbox, which is frozen only while it is taken and runs on as it was;
        `access_token` is its executor's. SandboxGone when it does not run, RuntimeFailure when the dump fails."""

    async def drop_fork_image(self, image: ForkImage) -> None:
        """Delete the image (forks started from it keep running)."""


class Runtime(Protocol):
    """Starts, freezes and stops sandboxes and opens connections into them.

    Every method is idempotent per sandbox ID; `stop` removes everything the sandbox had on the host
    except what `keep_files=True` asks to keep (its writable layer). A sandbox is running (frozen or not),
    snapshotted (no process, no memory, its files on disk), or unknown to the runtime.
    """

    async def start(self, spec: SandboxSpec) -> None:
        """Start the sandbox and return once its executor answers."""

    async def stop(self, sandbox_id: str, *, keep_files: bool = False) -> None:
        """Kill every process of the sandbox and release its resources."""

    def note_spec(self, spec: SandboxSpec) -> None:
        """Keep what is needed to reach this sandbox's executor later, e.g. its access token.

        Called by the activator before any action on a sandbox it did not start in this process (another
        replica, or before a restart): the runtime's other methods take only the sandbox's ID.
        """

    async def freeze(self, sandbox_id: str) -> None:
        """Freeze every process (memory kept, no CPU)."""

    async def thaw(self, sandbox_id: str) -> None:
        """Undo `freeze`."""

    async def open_socket(self, sandbox_id: str, port: int) -> socket.socket:
        """A connected, non-blocking TCP socket to `127.0.0.1:port` inside the sandbox."""

    async def set_egress(self, sandbox_id: str, rules: EgressRules) -> None:
        """Replace what the running (or frozen) sandbox may reach with `rules` (E2B's `update_network`).

        Also called right after a warm claim, whose sandbox was started before its rules were known.
        `start` and `restore` take the rules from `spec.egress`.
        """

    def capabilities(self) -> RuntimeCapabilities:
        """What this runtime can do here (snapshots, egress rules)."""

    def is_running(self, sandbox_id: str) -> bool:
        """Whether the sandbox's processes exist (frozen or not)."""

    async def stats(self, sandbox_id: str) -> SandboxStats:
        """Current resource use."""

    def snapshot_keeps_processes(self, sandbox_id: str) -> bool:
        """Whether a snapshot now would lose nothing that a restore cannot bring back.

        True where snapshots keep memory (CRIU), or when only the template's own processes run (its
        executor, start commands and the sandbox's autostart command, which a restore starts again). The idle
        policy snapshots only then.
        """

    async def snapshot(self, sandbox_id: str, *, memory: bool = True) -> SnapshotInfo:
        """Scale the sandbox (running or frozen) to zero: no process, no memory; its files stay on disk.

        With `memory`, its memory and processes are kept too where the runtime can (CRIU); without, never
        (E2B's `memory: false`: a restore starts afresh over the files).
        """

    async def restore(self, spec: SandboxSpec, *, memory: bool = True) -> None:
        """Bring a snapshotted sandbox back to running; return once its executor (and template ports) answer.

        Without `memory` a memory image the snapshot kept is dropped first, and the sandbox starts over its
        files as after a filesystem snapshot (E2B's cold boot, `on_resume="reboot"`).

        After a filesystem snapshot the executor starts afresh: `spec.init` is applied, the template's
        start commands run again, and so does the sandbox's autostart command (`pool._autostart`). Does
        nothing when the sandbox runs; `SandboxGone` when it is unknown.
        """

    def is_snapshotted(self, sandbox_id: str) -> bool:
        """Whether the sandbox is snapshotted (and so resumable with `restore`)."""

    def snapshotted_ids(self) -> set[str]:
        """Every snapshotted sandbox, including those found by `recover` after a restart."""

    def crashes(self) -> dict[str, str]:
        """The sandboxes `recover` found with their processes gone and their files kept (among `snapshotted_ids`),
        with why: pid 1 died, or the machine restarted, while no server watched them."""

    async def recover(self) -> set[str]:
        """After a restart of the server: the IDs of sandboxes whose processes still run.

        Snapshotted sandboxes stay resumable and are listed by `snapshotted_ids` afterwards; snapshots and
        restores a crash interrupted are finished or undone first.
        """
