"""The idle policy: after `pause_after` idle seconds freeze a sandbox, after `snapshot_after` scale it to zero.

Thresholds come from the template (`pause_after`, `snapshot_after`) unless the server overrides them for
every template (`serve --pause-after S --snapshot-after S`; 0 turns that step off). Both count from the last
traffic (or from the start or wake-up, when there was none since). A snapshot is only taken when the runtime
says it loses nothing (`snapshot_keeps_processes`); otherwise the sandbox stays frozen.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from activator._records import SandboxRecord, SandboxState
from activator._transitions import IdleFreeze, IdleSnapshot
from pool import Template

__all__ = ["IdlePolicy"]

Thresholds = tuple[float | None, float | None]  # (pause_after, snapshot_after); None: that step never happens


class IdlePolicy:
    """Which idle transition, if any, a sandbox is due for."""

    def __init__(
        self, templates: Mapping[str, Template], *, pause_after: float | None, snapshot_after: float | None
    ) -> None:
        """`pause_after` / `snapshot_after`: the server's override for every template (None: keep the template's)."""
        self._templates = templates  # live: a key's builds join it after the start
        self._server: Thresholds = (pause_after, snapshot_after)

    def thresholds(self, template: str) -> Thresholds:
        """(pause after, snapshot after) for the template's sandboxes: the server's flag over the template's own;
        never a snapshot for a `freeze_only` template."""
        t = self._templates.get(template)
        pause_after, snapshot_after = self._server
        if t is None:
            return _pick(pause_after, None), _pick(snapshot_after, None)
        return _pick(pause_after, t.pause_after), None if t.freeze_only else _pick(snapshot_after, t.snapshot_after)

    def soonest(self, template: str) -> float | None:
        """Idle seconds after which the template's sandboxes may take their first idle step."""
        steps = [s for s in self.thresholds(template) if s is not None]
        return min(steps) if steps else None

    def due(
        self, record: SandboxRecord, idle_for: float, keeps_processes: Callable[[], bool]
    ) -> IdleFreeze | IdleSnapshot | None:
        """The idle step `record` is due for after `idle_for` seconds without traffic, if any."""
        if record.user_paused or record.state is SandboxState.SNAPSHOTTED:
            return None
        pause_after, snapshot_after = self.thresholds(record.template)
        if snapshot_after is not None and idle_for >= snapshot_after and keeps_processes():
            return IdleSnapshot()
        if record.state is SandboxState.RUNNING and pause_after is not None and idle_for >= pause_after:
            return IdleFreeze()
        return None


def _pick(server: float | None, template: float | None) -> float | None:
    if server is None:
        return template
    return server or None  # 0 from the server: off
