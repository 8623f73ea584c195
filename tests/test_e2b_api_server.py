"""A real uvicorn server in a thread, serving the E2B control plane over the fake runtime (for the API tests)."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import threading
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import uvicorn
from litestar import Litestar

from activator import ACTIVATOR, API_KEYS, Activator, ActivatorSettings, ApiKeys, SqliteStore, e2b_router
from tests.polling import wait_for
from tests.test_activator_fakes import FakeRuntime, template


@dataclass
class ControlPlane:
    """What a test needs to talk to the running server: its URL, two API keys, and the fake runtime."""

    url: str
    key: str
    other_key: str
    runtime: FakeRuntime = field(repr=False)


def _app(data_dir: Path, runtime: FakeRuntime, keys_out: list[str]) -> Litestar:
    @contextlib.asynccontextmanager
    async def lifespan(app: Litestar) -> AsyncIterator[None]:
        store = await SqliteStore.open(data_dir / "state.sqlite")
        keys = ApiKeys(store)
        keys_out.extend([(await keys.create("first"))[1], (await keys.create("second"))[1]])
        activator = Activator(store, runtime, {"base": template("base")}, ActivatorSettings())
        await activator.recover()
        app.state[ACTIVATOR], app.state[API_KEYS] = activator, keys
        reaper = asyncio.create_task(activator.run_reaper())
        try:
            yield
        finally:
            reaper.cancel()
            await store.close()

    return Litestar([e2b_router()], lifespan=[lifespan])


@contextlib.contextmanager
def serve_control_plane(data_dir: Path) -> Iterator[ControlPlane]:
    """Run the control plane on a free loopback port until the block ends."""
    runtime, keys = FakeRuntime(), list[str]()
    server = uvicorn.Server(uvicorn.Config(_app(data_dir, runtime, keys), log_level="warning", ws="none"))
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    wait_for(lambda: server.started or not thread.is_alive(), what="the control plane to start")
    assert thread.is_alive(), "the control plane stopped while starting"
    try:
        yield ControlPlane(f"http://127.0.0.1:{sock.getsockname()[1]}", keys[0], keys[1], runtime)
    finally:
        server.should_exit = True
        thread.join(10)
        sock.close()
