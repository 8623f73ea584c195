"""`agent-sandbox deploy` end to end, as an agent runs it: a real server with a fast idle policy
(`--pause-after 1 --snapshot-after 2`), the CLI as a subprocess, the URLs fetched through `*.localhost`."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.polling import wait_for
from tests.scale_to_zero_fixtures import sandboxes_by_state
from tests.server_fixtures import REPO, RunningServer, running_server

# Dependency-free, counting its requests in memory: the count shows whether memory survived a snapshot.
NODE_APP = """
let hits = 0;
require("http").createServer((req, res) => {
  hits += 1;
  res.end(`hello from node, hit ${hits}\\n`);
}).listen(process.env.PORT);
"""

PYTHON_APP = """
import os
from http.server import BaseHTTPRequestHandler, HTTPServer

class Hello(BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200)
        self.end_headers()
        self.wfile.write(b"hello from python")

HTTPServer(("0.0.0.0", int(os.environ["PORT"])), Hello).serve_forever()
"""


@pytest.fixture(scope="module")
def idle_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    data_dir = tmp_path_factory.mktemp("deploy") / "data"
    with running_server(data_dir, "--pause-after", "1", "--snapshot-after", "2") as server:
        yield server


def deploy(server: RunningServer, *args: str | Path, key: str | None = None) -> subprocess.CompletedProcess[str]:
    """Run `agent-sandbox deploy ARGS` against `server`, configured the way the skill says (E2B_* variables)."""
    env = {name: value for name, value in os.environ.items() if not name.startswith("E2B_")}
    env |= {"E2B_API_URL": server.url, "E2B_API_KEY": key or server.api_key}
    argv = [sys.executable, "-m", "cli", "deploy", *map(str, args)]
    return subprocess.run(argv, cwd=REPO, env=env, capture_output=True, text=True, timeout=120)


def deployed(server: RunningServer, directory: Path, name: str) -> str:
    result = deploy(server, directory, "--name", name)
    assert result.returncode == 0, result.stderr
    url = result.stdout.strip()
    assert url.startswith("http://8080-")
    assert url.endswith(f".sandbox.localhost:{server.port}/")
    return url


def get(url: str) -> httpx.Response:
    return httpx.get(url, timeout=60)  # `*.localhost` resolves to loopback here


def _criu(server: RunningServer) -> bool:
    wait_for(lambda: "still" not in _runtime(server).get("criu_reason", ""), what="the CRIU trial")
    return _runtime(server).get("snapshot_kind") == "criu"


def _runtime(server: RunningServer) -> dict[str, str]:
    runtime: dict[str, str] = httpx.get(f"{server.url}/health").json()["runtime"]
    return runtime


def _write(directory: Path, name: str, text: str) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / name).write_text(text)
    return directory


def test_a_site_and_a_node_app_keep_their_urls_through_snapshots_updates_and_deletion(
    idle_server: RunningServer, tmp_path: Path
) -> None:
    site = _write(tmp_path / "site", "index.html", "<h1>version 1</h1>")
    node = _write(tmp_path / "node", "server.js", NODE_APP)
    site_url, node_url = deployed(idle_server, site, "site"), deployed(idle_server, node, "counter")
    assert get(site_url).text == "<h1>version 1</h1>"
    before = int(get(node_url).text.rsplit(" ", 1)[1])  # the deploy's own readiness probe counted too

    wait_for(lambda: sandboxes_by_state(idle_server)["snapshotted"] == 2, what="both deployments to snapshot")
    woken = get(site_url)  # held while the sandbox is restored, then served
    assert (woken.status_code, woken.text) == (200, "<h1>version 1</h1>")
    after = get(node_url).text
    # With CRIU the server's memory came back; with files only the runtime started it again from its files.
    expected = before + 1 if _criu(idle_server) else 1
    assert after == f"hello from node, hit {expected}\n"

    listed = deploy(idle_server, "--list")
    assert listed.returncode == 0, listed.stderr
    assert {tuple(line.split("\t")[::2]) for line in listed.stdout.splitlines()} == {
        ("site", site_url),
        ("counter", node_url),
    }

    wait_for(lambda: sandboxes_by_state(idle_server)["snapshotted"] == 2, what="both to snapshot again")
    _write(site, "index.html", "<h1>version 2</h1>")
    _write(site, "about.html", "about")
    assert deployed(idle_server, site, "site") == site_url  # updated in place, woken for it
    assert get(site_url).text == "<h1>version 2</h1>"
    assert get(site_url + "about.html").text == "about"

    for name, url in (("site", site_url), ("counter", node_url)):
        result = deploy(idle_server, "--delete", name)
        assert result.returncode == 0, result.stderr
        gone = get(url)
        assert gone.status_code == 502
        assert "was not found" in gone.json()["message"]


def test_an_update_removes_files_that_are_gone_and_restarts_a_python_app(
    idle_server: RunningServer, tmp_path: Path
) -> None:
    app = _write(tmp_path / "py", "app.py", PYTHON_APP)
    _write(app, "old.txt", "old")
    url = deployed(idle_server, app, "py")
    assert get(url).text == "hello from python"
    (app / "old.txt").unlink()
    (app / "app.py").write_text(PYTHON_APP.replace("hello from python", "hello again"))
    assert deployed(idle_server, app, "py") == url
    assert get(url).text == "hello again"
    listing = deploy(idle_server, "--list").stdout
    assert "py\t" in listing
    sandbox_id = url.split("-", 1)[1].split(".", 1)[0]
    envd = {"E2b-Sandbox-Id": sandbox_id, "E2b-Sandbox-Port": "49983"}
    token = httpx.get(f"{idle_server.url}/sandboxes/{sandbox_id}", headers={"X-API-Key": idle_server.api_key})
    envd["X-Access-Token"] = token.json()["envdAccessToken"]
    old = httpx.get(f"{idle_server.url}/files", params={"path": "/home/user/app/old.txt"}, headers=envd)
    assert old.status_code == 404
    assert deploy(idle_server, "--delete", "py").returncode == 0


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("/nonexistent-dir",), "/nonexistent-dir is not a directory"),
        (("{empty}",), "nothing to deploy in"),
        (("{site}", "--url", "http://127.0.0.1:1"), "cannot reach agent-sandbox at http://127.0.0.1:1"),
        (("{site}", "--key", "e2b_" + "0" * 32), "refused the API key (401)"),
        (("{site}", "--name", "Not_A_Name"), "invalid name 'Not_A_Name'"),
        (("--delete", "never-deployed"), "there is no deployment named 'never-deployed'"),
        ((), "give a DIR to deploy, --list or --delete NAME"),
    ],
)
def test_mistakes_get_one_line_and_exit_status_1(
    idle_server: RunningServer, tmp_path: Path, args: tuple[str, ...], message: str
) -> None:
    (tmp_path / "empty").mkdir()
    _write(tmp_path / "site", "index.html", "hi")
    filled = [arg.format(empty=tmp_path / "empty", site=tmp_path / "site") for arg in args]
    result = deploy(idle_server, *filled)
    assert result.returncode == 1
    assert result.stdout == ""
    assert result.stderr.count("\n") == 1
    assert result.stderr.startswith("agent-sandbox deploy: ")
    assert message in result.stderr
