"""The stand-in kubelet's process: wiring, start-up retries and an orderly shutdown on SIGTERM."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import ssl

from kube_dev._addresses import LoopbackAddresses
from kube_dev._context import NodeContext
from kube_dev._kubelet import Kubelet
from kube_dev._layout import ClusterLayout
from kube_dev._node import heartbeat, register_node
from kube_dev._pki import read_token
from kube_dev._tracking import ProcessTracker
from pool import KubeApi, KubeConnection, RuntimeFailure

__all__ = ["run_kubelet"]

logger = logging.getLogger("kubelet")


def run_kubelet(layout: ClusterLayout) -> int:
    """Run until SIGTERM or SIGINT; then stop every pod's processes and exit 0."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)  # one line per API call drowns what matters
    tracker = ProcessTracker(layout.cgroup_name)
    leftovers = tracker.sweep()  # from a kubelet that was killed: its pods' processes must not linger
    if leftovers:
        logger.info("killed the processes of %d containers left by a previous kubelet", leftovers)
    return asyncio.run(_main(layout, tracker))


async def _main(layout: ClusterLayout, tracker: ProcessTracker) -> int:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for number in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(number, stop.set)
    token = read_token(layout, "agent-sandbox-dev-kubelet")
    verify = ssl.create_default_context(cafile=layout.pki / "ca.crt")
    client = KubeApi(KubeConnection(server=layout.server, verify=verify, token=token))
    kubelet = Kubelet(NodeContext(client, layout, LoopbackAddresses(layout.pod_network), tracker))
    tasks: list[asyncio.Task[None]] = []
    try:
        if not await _register(client, layout.node_name, stop):
            return 0
        logger.info("node %s registered and Ready", layout.node_name)
        tasks = [asyncio.create_task(kubelet.sync_forever()), asyncio.create_task(heartbeat(client, layout.node_name))]
        await stop.wait()
        logger.info("stopping: ending every pod's processes")
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await kubelet.shutdown()
        await client.aclose()
        tracker.sweep()
    return 0


async def _register(client: KubeApi, name: str, stop: asyncio.Event) -> bool:
    """Register the node, retrying while the apiserver starts; False if told to stop first."""
    while not stop.is_set():
        try:
            await register_node(client, name)
            return True
        except RuntimeFailure as exc:
            logger.info("waiting for the apiserver: %r", exc)
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(0.2):
                await stop.wait()
    return False
