"""`loadtests.bench_kube` runs end to end with tiny counts and prints every series (a smoke test, not a timing)."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

from loadtests.bench_kube import SERIES
from tests.kube_fixtures import require_binaries
from tests.server_fixtures import REPO

pytestmark = pytest.mark.timeout(360)


def test_the_kube_benchmark_prints_figures_for_every_series() -> None:
    require_binaries()
    argv = [sys.executable, "-m", "loadtests.bench_kube", "--runs", "2", "--warm", "1"]
    done = subprocess.run(argv, cwd=REPO, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, f"{done.stdout}\n{done.stderr[-6000:]}"
    for name in SERIES:
        figures = rf"^{re.escape(name)} .* 2( +\d+\.\d){{3}}$"
        assert re.search(figures, done.stdout, re.MULTILINE), f"no figures for {name}:\n{done.stdout}"
    assert re.search(r"^ratios: cold/warm create x\d+\.\d+", done.stdout, re.MULTILINE), done.stdout
