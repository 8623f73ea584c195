"""Smoke tests that reach the real package registries, as users do: the only tests whose traffic leaves this
machine. A default sandbox installs from PyPI with `pip install` as typed, and `npx` downloads from npm."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from pool import LocalRuntime
from tests.runtime_fixtures import TEMPLATES, local_runtime, spec
from tests.sandbox_exec import run_in_sandbox

pytestmark = pytest.mark.anyio


async def _built(rt: LocalRuntime, template: str) -> None:
    await asyncio.to_thread(rt.images.build, TEMPLATES[template], lambda _line: None)  # no-op when built


async def test_pip_install_as_users_type_it_works_in_a_default_sandbox(tmp_path: Path) -> None:
    async with local_runtime(tmp_path) as rt:
        await rt.start(spec("pipper"))
        installed = await run_in_sandbox(rt, "pipper", "pip install --no-cache-dir six && python -c 'import six'")
        assert installed.exit_code == 0, installed


async def test_npx_downloads_a_package_and_runs_it_in_a_default_sandbox(tmp_path: Path) -> None:
    async with local_runtime(tmp_path) as rt:
        await _built(rt, "sandbox-base-node")
        await rt.start(spec("npxer", TEMPLATES["sandbox-base-node"]))
        ran = await run_in_sandbox(rt, "npxer", "npx --yes semver@7.6.3 1.2.3")
        assert ran.stdout.strip() == "1.2.3", ran
