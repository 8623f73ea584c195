"""`loadtests.bench_kube` runs end to end with tiny counts and prints every series (a smoke test, not a timing).

On the stand-in's cluster only: its `--real-node` half (a second real-node cluster, about 4 min under load) and
`--guard` are left out of the suite to keep CI within its budget; the real-node tier runs the same creates,
warm claims, pauses and resumes on the session's real node, guarded and not. Run them by hand:
`python -m loadtests.bench_kube --runs 1 --warm 1 --real-node --guard`."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

from loadtests.bench_kube import SERIES
from tests.kube_fixtures import require_binaries
from tests.server_fixtures import REPO

pytestmark = pytest.mark.timeout(900)


def test_the_kube_benchmark_prints_figures_for_every_series() -> None:
    require_binaries()
    argv = [sys.executable, "-m", "loadtests.bench_kube", "--runs", "1", "--warm", "1"]
    done = subprocess.run(argv, cwd=REPO, capture_output=True, text=True, timeout=850)
    assert done.returncode == 0, f"{done.stdout}\n{done.stderr[-6000:]}"
    for name in SERIES:
        row = rf"^{re.escape(name)} .* +1( +\d+\.\d){{3}}$"
        assert re.search(row, done.stdout, re.MULTILINE), f"no figures for {name}:\n{done.stdout}"
    assert re.search(r"^ratios \(stand-in\): cold/warm create x\d+\.\d+", done.stdout, re.MULTILINE), done.stdout
