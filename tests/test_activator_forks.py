"""`Activator.fork` over a fake runtime: each fork's outcome is its own (an unexpected error in one start is that
fork's entry, the others run and are answered), the image is dropped whatever happens, the gateway's connections
into the source go before it is imaged, and forks have their own ids and tokens and E2B's default timeout."""

from __future__ import annotations

import pytest

from activator import ActivatorError, SandboxRecord, Store
from pool import ForkImage, SandboxSpec
from tests import test_activator_fakes as fakes

store = fakes.store  # the shared fixtures, bound by name for pytest
clock = fakes.clock
pytestmark = pytest.mark.anyio


class ForkingRuntime(fakes.FakeRuntime):
    """A fake runtime that forks: `fork_image` hands out images, whose drops it counts; the n-th fork start
    (`broken`) raises an OSError, as a restore whose pid 1 died at once would."""

    def __init__(self, broken: int | None = None) -> None:
        super().__init__()
        self.images: list[ForkImage] = []
        self.dropped: list[ForkImage] = []
        self.fork_starts = 0
        self.broken = broken

    async def fork_refusal(self) -> str:
        return ""

    async def fork_image(self, sandbox_id: str, access_token: str | None) -> ForkImage:
        self._call("fork_image", sandbox_id)
        image = ForkImage(source_id=sandbox_id, key=f"k{len(self.images)}", access_token=access_token)
        self.images.append(image)
        return image

    async def drop_fork_image(self, image: ForkImage) -> None:
        self.dropped.append(image)

    async def start(self, spec: SandboxSpec) -> None:
        if spec.fork is not None:
            self.fork_starts += 1
            if self.fork_starts == self.broken:
                raise OSError("the restored pid 1 is gone")
        await super().start(spec)


async def test_an_unexpected_error_is_one_forks_entry_and_the_others_are_answered(
    store: Store, clock: fakes.Clock
) -> None:
    runtime = ForkingRuntime(broken=2)
    act = fakes.activator(store, runtime, clock, on_halt=lambda i: runtime.calls.append(("halt", i)), forker=runtime)
    source = await act.create("owner", fakes.request(secure=True))

    outcomes = await act.fork("owner", source.id, count=3, lifetime=None)

    started = [o for o in outcomes if isinstance(o, SandboxRecord)]
    failed = [o for o in outcomes if isinstance(o, ActivatorError)]
    assert (len(started), len(failed)) == (2, 1)
    assert failed[0].status_code == 500
    assert "the restored pid 1 is gone" in str(failed[0])
    assert runtime.dropped == runtime.images  # the image goes once every fork has its outcome
    assert runtime.calls.index(("halt", source.id)) < runtime.calls.index(("fork_image", source.id))
    assert {fork.id for fork in started} <= runtime.running
    assert len({source.id, *(fork.id for fork in started)}) == 3
    assert len({source.access_token, *(fork.access_token for fork in started)}) == 3
    assert all(fork.timeout == 15 for fork in started)  # E2B's default for forks
    assert all(runtime.specs[fork.id].fork == runtime.images[0] for fork in started)
