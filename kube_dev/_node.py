"""The stand-in's Node object: registered once, untainted, and marked Ready by a periodic heartbeat.

The controller-manager runs without its node-lifecycle controller, so nothing marks the node NotReady
or taints it again; the heartbeat is there so `kubectl get nodes` shows a live node, as with a kubelet.
"""

from __future__ import annotations

import asyncio
import logging
import platform

from kube_dev._status import now
from pool import KubeApi, KubeApiError, RuntimeFailure

__all__ = ["heartbeat", "register_node"]

logger = logging.getLogger("kubelet")

HEARTBEAT_SECONDS = 10.0
_CAPACITY = {"cpu": "32", "memory": "256Gi", "pods": "1000", "ephemeral-storage": "100Gi"}


async def register_node(client: KubeApi, name: str) -> None:
    """Create the Node (or keep the existing one), drop the not-ready taint admission put on it, mark it Ready."""
    labels = {"kubernetes.io/hostname": name, "kubernetes.io/os": "linux", "agent-sandbox.dev/stand-in": "true"}
    body = {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": labels}}
    try:
        await client.call("POST", "/api/v1/nodes", body=body)
    except KubeApiError as exc:
        if exc.status != 409:
            raise
    await client.call(
        "PATCH", f"/api/v1/nodes/{name}", body={"spec": {"taints": None}}, content_type="application/merge-patch+json"
    )
    await _report(client, name)


async def _report(client: KubeApi, name: str) -> None:
    stamp = now()
    status = {
        "conditions": [
            {"type": "Ready", "status": "True", "reason": "KubeletReady", "message": "agent-sandbox stand-in kubelet",
             "lastHeartbeatTime": stamp, "lastTransitionTime": stamp},
        ],
        "addresses": [{"type": "InternalIP", "address": "127.0.0.1"}, {"type": "Hostname", "address": name}],
        "capacity": _CAPACITY,
        "allocatable": _CAPACITY,
        "nodeInfo": {
            "kubeletVersion": "v1.20.2-agent-sandbox-stand-in", "kubeProxyVersion": "", "operatingSystem": "linux",
            "architecture": platform.machine(), "containerRuntimeVersion": "host-process://", "kernelVersion":
            platform.release(), "osImage": "", "machineID": "", "systemUUID": "", "bootID": "",
        },
    }  # fmt: skip
    await client.call(
        "PATCH", f"/api/v1/nodes/{name}/status", body={"status": status},
        content_type="application/strategic-merge-patch+json",
    )  # fmt: skip


async def heartbeat(client: KubeApi, name: str) -> None:
    """Report the node Ready every HEARTBEAT_SECONDS, re-registering it if someone deleted it."""
    while True:
        await asyncio.sleep(HEARTBEAT_SECONDS)
        try:
            await _report(client, name)
        except KubeApiError as exc:
            if exc.status == 404:
                await register_node(client, name)
            else:
                logger.warning("node heartbeat failed: %s", exc)
        except RuntimeFailure as exc:
            logger.warning("node heartbeat failed: %r", exc)
