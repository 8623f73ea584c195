"""Which sandbox pods exist, and at which IP each Ready one answers (one list + watch over the namespace)."""

from __future__ import annotations

import msgspec

from pool._errors import RuntimeFailure
from pool._kube._api import KubeApi
from pool._kube._manifest import Pod, PodList
from pool._kube._shapes import ROLE_SELECTOR
from pool._kube._watch import ObjectWatch

__all__ = ["PodWatch"]


class PodWatch(ObjectWatch[Pod]):
    """The sandbox pods of one namespace, kept current; `start` returns once the first list is in."""

    def __init__(self, api: KubeApi, namespace: str) -> None:
        super().__init__(
            api,
            f"/api/v1/namespaces/{namespace}/pods",
            ROLE_SELECTOR,
            item=msgspec.json.Decoder(Pod),
            listing=msgspec.json.Decoder(PodList),
        )

    def ready_ip(self, sandbox_id: str) -> str | None:
        """The IP of a Ready pod of the sandbox, or None."""
        for pod in self.of(sandbox_id).values():
            if (ip := pod.ready_ip) is not None:
                return ip
        return None

    def has_live_pods(self, sandbox_id: str) -> bool:
        """A pod of the sandbox that may still run something (not one being deleted whose containers all ended)."""
        return bool(self.live_pods(sandbox_id))

    async def wait_ready(self, sandbox_id: str, within: float) -> str:
        """The IP of a Ready pod of the sandbox, once there is one; RuntimeFailure after `within` seconds."""
        await self.wait(lambda: self.ready_ip(sandbox_id) is not None, within, f"sandbox {sandbox_id} to be Ready")
        ip = self.ready_ip(sandbox_id)
        assert ip is not None
        return ip

    async def wait_gone(self, sandbox_id: str, within: float) -> None:
        """Return once the sandbox has no live pod left (its processes ended); RuntimeFailure after `within` s,
        naming each pod left and the state of its containers."""
        try:
            await self.wait(lambda: not self.live_pods(sandbox_id), within, f"the pods of sandbox {sandbox_id} to go")
        except RuntimeFailure as exc:
            left = "; ".join(str(pod) for pod in self.live_pods(sandbox_id))
            raise RuntimeFailure(f"{exc}: {left}") from exc

    def live_pods(self, sandbox_id: str) -> list[Pod]:
        """The sandbox's pods that may still run something (see `has_live_pods`)."""
        return [pod for pod in self.of(sandbox_id).values() if not pod.ended]
