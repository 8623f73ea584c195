"""What every pod worker of one stand-in kubelet shares: the API client, the node's layout, addresses, cgroups."""

from __future__ import annotations

from dataclasses import dataclass

from kube_dev._addresses import LoopbackAddresses
from kube_dev._layout import ClusterLayout
from kube_dev._tracking import ProcessTracker
from pool import KubeApi

__all__ = ["NodeContext"]


@dataclass(frozen=True)
class NodeContext:
    """Shared by the kubelet's tasks; `addresses` is mutated only on the event loop, so needs no lock."""

    client: KubeApi
    layout: ClusterLayout
    addresses: LoopbackAddresses
    tracker: ProcessTracker
