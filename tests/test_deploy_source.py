"""What `agent-sandbox deploy` makes of a directory: the kind of app, the manifest, the archive (no server)."""

from __future__ import annotations

import io
import tarfile
from pathlib import Path

import pytest

from cli._deploy_errors import DeployError
from cli._deploy_source import AppPlan, detect, pack, scan


def _tree(root: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    return root


@pytest.mark.parametrize(
    ("files", "kind", "template", "serve"),
    [
        (
            {"package.json": '{"scripts": {"start": "node a.js"}}', "server.js": ""},
            "node",
            "sandbox-base-node",
            "npm start",
        ),
        ({"package.json": '{"name": "no-start"}', "server.js": ""}, "node", "sandbox-base-node", "node server.js"),
        ({"server.js": "", "index.html": ""}, "node", "sandbox-base-node", "node server.js"),
        ({"app.py": "", "main.py": ""}, "python", "base", "python3 app.py"),
        ({"main.py": "", "index.html": ""}, "python", "base", "python3 main.py"),
        ({"index.html": ""}, "static", "base", "python3 -m http.server 8080 --bind 0.0.0.0"),
    ],
)
def test_the_first_matching_rule_decides_how_a_directory_is_served(
    tmp_path: Path, files: dict[str, str], kind: str, template: str, serve: str
) -> None:
    plan = detect(_tree(tmp_path, files), None)
    assert plan == AppPlan(kind=kind, template=template, serve=serve, port=8080)  # type: ignore[arg-type]


def test_the_command_runs_in_the_app_directory_with_port_set_and_output_logged(tmp_path: Path) -> None:
    command = detect(_tree(tmp_path, {"server.js": ""}), 3000).command()
    assert command.startswith("cd /home/user/app && export PORT=3000 ")
    assert command.endswith("&& exec node server.js >> /home/user/.config/agent-sandbox/autostart.log 2>&1")


@pytest.mark.parametrize(
    ("files", "message"),
    [
        ({}, "nothing to deploy in"),
        ({"README.md": "hi"}, "expected package.json (with a start script), server.js, app.py, main.py or index.html"),
        ({"package.json": "[1, 2"}, "package.json is not a JSON object"),
    ],
)
def test_a_directory_without_an_app_says_what_it_needs(tmp_path: Path, files: dict[str, str], message: str) -> None:
    with pytest.raises(DeployError, match=message.replace("(", r"\(").replace(")", r"\)")):
        detect(_tree(tmp_path, files), None)


def test_a_missing_directory_is_named(tmp_path: Path) -> None:
    with pytest.raises(DeployError, match="is not a directory"):
        detect(tmp_path / "missing", None)


def test_the_manifest_tells_content_mode_and_links_apart_and_skips_version_control(tmp_path: Path) -> None:
    _tree(tmp_path, {"a.txt": "same", "b.txt": "same", "bin/run": "#!/bin/sh", ".git/HEAD": "ref", "sub/c": "c"})
    (tmp_path / "bin" / "run").chmod(0o755)
    (tmp_path / "link").symlink_to("a.txt")
    (tmp_path / "dirlink").symlink_to("sub")
    manifest = scan(tmp_path)
    assert sorted(manifest) == ["a.txt", "b.txt", "bin/run", "dirlink", "link", "sub/c"]
    assert manifest["a.txt"] == manifest["b.txt"]
    assert manifest["bin/run"].endswith("+x")
    assert (manifest["link"], manifest["dirlink"]) == ("link:a.txt", "link:sub")


def test_the_archive_keeps_only_the_named_paths_with_modes_and_links(tmp_path: Path) -> None:
    _tree(tmp_path, {"a.txt": "a", "skip.txt": "s", "bin/run": "#!/bin/sh"})
    (tmp_path / "bin" / "run").chmod(0o755)
    (tmp_path / "link").symlink_to("a.txt")
    with tarfile.open(fileobj=io.BytesIO(pack(tmp_path, ["a.txt", "bin/run", "link"]))) as archive:
        members = {m.name: m for m in archive.getmembers()}
        extracted = archive.extractfile("a.txt")
        assert extracted is not None
        assert extracted.read() == b"a"
    assert sorted(members) == ["a.txt", "bin/run", "link"]
    assert members["bin/run"].mode & 0o111
    assert (members["link"].issym(), members["link"].linkname) == (True, "a.txt")
    assert {m.uid for m in members.values()} == {0}
