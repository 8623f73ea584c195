"""What the kubernetes runtime reads from a pod's status: when it answers, and when nothing of it runs any more."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest

from pool._kube._manifest import Pod


def _pod(*, deleting: bool, states: list[dict[str, Any]], ready: bool = False) -> Pod:
    raw = {
        "metadata": {"name": "sandbox-x-1", **({"deletionTimestamp": "2026-12-03T08:48:29Z"} if deleting else {})},
        "status": {
            "podIP": "10.244.0.7",
            "conditions": [{"type": "Ready", "status": "True" if ready else "False"}],
            "containerStatuses": [{"name": "executor", "state": state} for state in states],
        },
    }
    return msgspec.json.decode(msgspec.json.encode(raw), type=Pod)


TERMINATED = {"terminated": {"exitCode": 0, "reason": "Completed"}}
RUNNING = {"running": {"startedAt": "2026-12-03T08:48:24Z"}}


@pytest.mark.parametrize(
    ("deleting", "states", "ended"),
    [
        (True, [TERMINATED], True),  # a real kubelet keeps such a pod up to 10 s: it counts as gone
        (True, [RUNNING], False),  # still in its grace period
        (True, [TERMINATED, RUNNING], False),
        (True, [], False),  # no status yet: nothing says it ended
        (False, [TERMINATED], False),  # a container that exited in a pod that stays may be restarted
    ],
)
def test_a_pod_has_ended_once_it_is_being_deleted_and_every_container_terminated(
    deleting: bool, states: list[dict[str, Any]], ended: bool
) -> None:
    assert _pod(deleting=deleting, states=states).ended is ended


def test_a_pod_whose_sidecar_still_runs_has_not_ended() -> None:
    pod = _pod(deleting=True, states=[TERMINATED])
    raw = msgspec.json.decode(msgspec.json.encode(pod))
    raw["status"]["initContainerStatuses"] = [{"name": "mesh", "state": RUNNING}]
    assert msgspec.json.decode(msgspec.json.encode(raw), type=Pod).ended is False


def test_a_pod_being_deleted_is_never_answered_at_even_while_ready() -> None:
    assert _pod(deleting=False, states=[RUNNING], ready=True).ready_ip == "10.244.0.7"
    assert _pod(deleting=True, states=[RUNNING], ready=True).ready_ip is None


def test_a_pod_left_after_a_timeout_is_named_with_each_container_state() -> None:
    pod = _pod(deleting=True, states=[RUNNING, {"waiting": {"reason": "ContainerCreating"}}, TERMINATED])
    assert str(pod) == (
        "pod sandbox-x-1 (deleted at 2026-12-03T08:48:29Z; "
        "executor running, executor waiting (ContainerCreating), executor terminated (Completed))"
    )
    assert str(_pod(deleting=False, states=[])) == "pod sandbox-x-1 (not deleted; none reported yet)"
