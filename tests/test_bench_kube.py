"""`loadtests.bench_kube` runs end to end with tiny counts and prints every series, the stand-in's and the real
node's (a smoke test, not a timing). Its `--guard` half is not run here: a guarded pod's deletion has been seen
to outlast the runtime's 60 s stop timeout (docs/kubernetes.md), which would fail the run for what the egress
tests already show."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

from loadtests.bench_kube import SERIES
from tests.real_node_fixtures import require_real_node
from tests.server_fixtures import REPO

pytestmark = pytest.mark.timeout(1200)


def test_the_kube_benchmark_prints_figures_for_every_series_on_the_stand_in_and_the_real_node() -> None:
    require_real_node()
    argv = [sys.executable, "-m", "loadtests.bench_kube", "--runs", "1", "--warm", "1", "--real-node"]
    done = subprocess.run(argv, cwd=REPO, capture_output=True, text=True, timeout=1150)
    assert done.returncode == 0, f"{done.stdout}\n{done.stderr[-6000:]}"
    figures = r" +1( +\d+\.\d){3}"
    for name in SERIES:
        row = rf"^{re.escape(name)} .*{figures}  \| real node:{figures}  x\d+\.\d\d$"
        assert re.search(row, done.stdout, re.MULTILINE), f"no figures for {name}:\n{done.stdout}"
    for cluster in ("stand-in", "real node"):
        assert re.search(rf"^ratios \({cluster}\): cold/warm create x\d+\.\d+", done.stdout, re.MULTILINE), done.stdout
