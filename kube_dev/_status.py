"""Pod status as the stand-in kubelet reports it: container states, conditions and phase.

`PodState` is mutated only by the tasks of one `PodWorker` (all on the event loop), and read by its
publisher task, which sends the whole status each time; so a status on the server is never half-updated.
"""

from __future__ import annotations

import datetime
from typing import Any, Literal

__all__ = ["ContainerState", "PodState", "now"]


def now() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class ContainerState:
    """One container's state as the apiserver's ContainerStatus describes it."""

    def __init__(self, name: str, image: str) -> None:
        self.name = name
        self.image = image
        self.phase: Literal["waiting", "running", "terminated"] = "waiting"
        self.reason = "ContainerCreating"
        self.message = ""
        self.started_at = ""
        self.finished_at = ""
        self.exit_code = 0
        self.restart_count = 0
        self.ready = False
        self.last: dict[str, Any] = {}

    def waiting(self, reason: str, message: str = "") -> None:
        if self.phase == "terminated":
            self.last = {"terminated": self._terminated()}
        self.phase, self.reason, self.message, self.ready = "waiting", reason, message, False

    def running(self) -> None:
        self.phase, self.started_at, self.ready = "running", now(), False

    def terminated(self, exit_code: int, reason: str = "", message: str = "") -> None:
        self.phase, self.exit_code, self.finished_at, self.ready = "terminated", exit_code, now(), False
        self.reason = reason or ("Completed" if exit_code == 0 else "Error")
        self.message = message

    def _terminated(self) -> dict[str, Any]:
        state: dict[str, Any] = {"exitCode": self.exit_code, "reason": self.reason, "finishedAt": self.finished_at}
        if self.started_at:
            state["startedAt"] = self.started_at
        if self.message:
            state["message"] = self.message
        return state

    def to_status(self) -> dict[str, Any]:
        if self.phase == "running":
            state: dict[str, Any] = {"running": {"startedAt": self.started_at}}
        elif self.phase == "terminated":
            state = {"terminated": self._terminated()}
        else:
            state = {"waiting": {"reason": self.reason, **({"message": self.message} if self.message else {})}}
        return {
            "name": self.name, "image": self.image, "imageID": "", "ready": self.ready,
            "started": self.phase == "running", "restartCount": self.restart_count, "state": state,
            "lastState": self.last,
        }  # fmt: skip


class PodState:
    """Everything the status of one pod is computed from."""

    def __init__(self, init: list[ContainerState], main: list[ContainerState]) -> None:
        self.init = init
        self.main = main
        self.pod_ip = ""
        self.start_time = now()
        self.initialized = not init
        self.final_phase: Literal["", "Succeeded", "Failed"] = ""
        self._transitions: dict[str, tuple[str, str]] = {}

    def phase(self) -> str:
        if self.final_phase:
            return self.final_phase
        if self.initialized and any(c.phase != "waiting" or c.restart_count for c in self.main):
            return "Running"
        return "Pending"

    def _condition(self, kind: str, true: bool) -> dict[str, str]:
        status = "True" if true else "False"
        previous = self._transitions.get(kind)
        if previous is None or previous[0] != status:
            self._transitions[kind] = (status, now())
        return {"type": kind, "status": status, "lastTransitionTime": self._transitions[kind][1]}

    def to_status(self) -> dict[str, Any]:
        ready = self.initialized and all(c.ready for c in self.main)
        status: dict[str, Any] = {
            "phase": self.phase(),
            "hostIP": "127.0.0.1",
            "startTime": self.start_time,
            "conditions": [
                self._condition("PodScheduled", True),
                self._condition("Initialized", self.initialized),
                self._condition("ContainersReady", ready),
                self._condition("Ready", ready),
            ],
            "containerStatuses": [c.to_status() for c in self.main],
        }
        if self.init:
            status["initContainerStatuses"] = [c.to_status() for c in self.init]
        if self.pod_ip:
            status["podIP"] = self.pod_ip
            status["podIPs"] = [{"ip": self.pod_ip}]
        return status
