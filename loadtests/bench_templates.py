"""Benchmark: templates built with the E2B Template SDK, against the built-in `base` in the same run.

Prints, in one run:

- a cold build of a small template (`from_template("base")`, a RUN, a COPY of a small file, a start command with
  `wait_for_port`): every step's layer is new (a fresh value in the first RUN), so each is built in a build
  sandbox, then the template is started once;
- a rebuild with only its last step changed: the layers below come from the cache;
- create → 201 from the built template and from `base`, cold (a server without warm pools) and from a warm
  pool (a second server with `--warm base=1 --warm-builds 1`, each create waiting for the pool to be full).

Builds go through the SDK (`Template.build`, which polls the status every 0.2 s: a build's figure is at that
granularity); creates are a raw `POST /v2/sandboxes`. Run as root (the SDK's package registries are not used):

    .venv/bin/python -m loadtests.bench_templates --runs 10
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
import uuid
from pathlib import Path

import httpx
from e2b import Template, wait_for_port
from e2b.template.main import TemplateFinal

from loadtests._creates import timed_creates
from loadtests._stats import row
from tests.server_fixtures import RunningServer, running_server


def _template(context: Path, first: str, last: str) -> TemplateFinal:
    return (
        Template(file_context_path=str(context))
        .from_template("base")
        .run_cmd(f"echo {first} > /etc/bench-first", user="root")
        .copy("page.html", "/home/user/site/")
        .run_cmd(f"echo {last} > /home/user/site/last.txt")
        .set_start_cmd("python3 -m http.server 8000 --directory /home/user/site", wait_for_port(8000))
    )


def _builds(server: RunningServer, context: Path, runs: int) -> tuple[list[float], list[float], str]:
    os.environ.update(server.e2b_env())
    cold, changed = [], []
    name = f"bench-{uuid.uuid4().hex[:8]}"
    for _ in range(runs):
        first = uuid.uuid4().hex
        began = time.perf_counter()
        Template.build(_template(context, first, "one"), name)
        cold.append((time.perf_counter() - began) * 1000)
        began = time.perf_counter()
        Template.build(_template(context, first, uuid.uuid4().hex), name)
        changed.append((time.perf_counter() - began) * 1000)
    return cold, changed, name


def _pool_of(server: RunningServer, name: str) -> str:
    """The warm pool's name of the template's current build: `<templateID>/<buildID>`."""
    with httpx.Client(base_url=server.url, headers={"X-API-Key": server.api_key}) as client:
        listed = next(t for t in client.get("/templates").json() if t["names"] == [name])
    return f"{listed['templateID']}/{listed['buildID']}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=10)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-templates-") as tmp:
        context = Path(tmp) / "context"
        context.mkdir()
        (context / "page.html").write_text("<title>bench</title>\n")
        with running_server(Path(tmp) / "cold") as cold:
            built, rebuilt, name = _builds(cold, context, args.runs)
            cold_built = timed_creates(cold, name, args.runs)
            cold_base = timed_creates(cold, "base", args.runs)
        with running_server(Path(tmp) / "warm", "--warm", "base=1", "--warm-builds", "1") as warm:
            _, _, warm_name = _builds(warm, context, 1)
            warm_built = timed_creates(warm, warm_name, args.runs, pool=_pool_of(warm, warm_name))
            warm_base = timed_creates(warm, "base", args.runs, pool="base")
    print(row("cold build of a small template (SDK)", built))
    print(row("rebuild, last step changed (SDK)", rebuilt))
    print(row("create from it, cold -> 201", cold_built))
    print(row("create from base, cold -> 201 (baseline)", cold_base))
    print(row("create from it, warm pool -> 201", warm_built))
    print(row("create from base, warm pool -> 201 (baseline)", warm_base))


if __name__ == "__main__":
    main()
