"""`agent-sandbox templates`: build the built-in templates (also their sandboxed layers), list and delete a key's
own templates on a running server."""

from __future__ import annotations

import shutil
import stat
import subprocess
import sys
import uuid
from pathlib import Path

from e2b import Template

from gateway._settings import DEFAULT_TEMPLATES, ServeSettings
from pool import ImageStore, load_templates
from tests.runtime_fixtures import IMAGE_CACHE, TEMPLATES
from tests.server_fixtures import REPO, RunningServer


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "cli", *args], cwd=REPO, capture_output=True, text=True, timeout=600)


def test_a_keys_templates_are_listed_and_deleted_with_the_cli(e2b_env: RunningServer) -> None:
    name = f"cli-{uuid.uuid4().hex[:8]}"
    Template.build(Template().from_template("base").run_cmd("true"), name)
    server = ("--url", e2b_env.url, "--key", e2b_env.api_key)
    listed = _cli("templates", "list", *server)
    assert listed.returncode == 0, listed.stderr
    rows = [line.split("\t") for line in listed.stdout.splitlines()]
    assert ["base", "base", "ready", "built-in"] in [row[:4] for row in rows]
    assert any(row[0] == name and row[2:4] == ["ready", "this key"] for row in rows)

    deleted = _cli("templates", "delete", name, *server)
    assert deleted.returncode == 0, deleted.stderr
    assert name not in _cli("templates", "list", *server).stdout
    again = _cli("templates", "delete", name, *server)
    assert again.returncode == 1
    assert f"404: template '{name}' not found" in again.stderr
    builtin = _cli("templates", "delete", "base", *server)
    assert "403: template 'base' is built in" in builtin.stderr


def test_templates_build_makes_a_builtin_templates_run_layer_in_a_build_sandbox(tmp_path: Path) -> None:
    templates = tmp_path / "templates"
    templates.mkdir()
    shutil.copy(DEFAULT_TEMPLATES / "base.toml", templates / "base.toml")
    nonce = uuid.uuid4().hex
    (templates / "with-run.toml").write_text(
        f'name = "with-run"\nparent = "base"\nready = "test -f /etc/made-by-run"\n\n'
        f'[[layers]]\nkind = "run"\nscript = "echo {nonce} > /etc/made-by-run"\n'
    )
    template = load_templates(templates)["with-run"]
    store = ImageStore(IMAGE_CACHE, ServeSettings().executor_source)
    built = _cli("templates", "build", "with-run", "--templates", str(templates), "--image-cache", str(IMAGE_CACHE),
                 "--data-dir", str(tmp_path / "data"))  # fmt: skip
    key = store.plan(template)[-2][0]
    try:
        assert built.returncode == 0, built.stdout + built.stderr
        assert store.is_built(template)
        assert (IMAGE_CACHE / "layers" / key / "etc/made-by-run").read_text() == f"{nonce}\n"
        assert not list((tmp_path / "data" / "sandboxes").iterdir())  # the build sandboxes are gone
    finally:
        shutil.rmtree(IMAGE_CACHE / "layers" / key, ignore_errors=True)


def test_a_refresh_gives_a_templates_layers_new_keys_once_recorded_and_leaves_the_others(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    source = ServeSettings().executor_source
    base, other = TEMPLATES["base"], TEMPLATES["code-interpreter-v1"]
    before = ImageStore(cache, source)
    keys, other_keys = [k for k, _ in before.plan(base)], [k for k, _ in before.plan(other)]
    refreshing = ImageStore(cache, source, refreshed={"base": 1})  # what `images build --refresh base` builds
    new_keys = [k for k, _ in refreshing.plan(base)]
    assert set(new_keys).isdisjoint(keys)
    assert [k for k, _ in before.plan(base)] == keys  # not used until recorded
    refreshing.record_refresh({"base": 1})
    assert stat.S_IMODE((cache / "layers").stat().st_mode) == 0o700  # root's alone: tenants' files are in it
    assert [k for k, _ in ImageStore(cache, source).plan(base)] == new_keys
    assert [k for k, _ in before.plan(base)] == new_keys  # a running server's store reads it at its next plan
    assert [k for k, _ in before.plan(other)] == other_keys
