"""A TOML template's `copy` layer: its files are named by their hash at load, never read outside the templates
directory, and packed into the archive the COPY step unpacks only while they still hash the same."""

from __future__ import annotations

import io
import os
import shutil
import tarfile
from pathlib import Path

import pytest

from gateway._settings import DEFAULT_TEMPLATES, ServeSettings
from pool import CopyLayer, ImageStore, TemplateError, load_templates
from pool._template_context import ContextError, pack_context
from tests.runtime_fixtures import IMAGE_CACHE

COPY = '[[layers]]\nkind = "copy"\nsource = "{source}"\ndest = "/srv/app"\nuser = "user"\nmode = "640"\n'


def templates_with_copy(directory: Path, source: str = "files/app") -> Path:
    """A templates directory: `base`, and `tools` over it copying `source` (files/app holds two files)."""
    directory.mkdir(parents=True)
    shutil.copy(DEFAULT_TEMPLATES / "base.toml", directory / "base.toml")
    (directory / "files/app/sub").mkdir(parents=True)
    (directory / "files/app/hello.txt").write_text("hello\n")
    (directory / "files/app/sub/run.sh").write_text("echo run\n")
    (directory / "tools.toml").write_text('name = "tools"\nparent = "base"\n\n' + COPY.format(source=source))
    return directory


def _copy_layer(directory: Path) -> CopyLayer:
    layer = load_templates(directory)["tools"].layers[-1]
    assert isinstance(layer, CopyLayer)
    return layer


def test_a_copy_layer_is_named_by_its_files_not_by_where_they_are(tmp_path: Path) -> None:
    first, second = templates_with_copy(tmp_path / "one"), templates_with_copy(tmp_path / "two")
    layer = _copy_layer(first)
    assert (layer.source, layer.dest, layer.user, layer.mode, layer.context) == (
        "files/app", "/srv/app", "user", "640", str(first)
    )  # fmt: skip
    store = ImageStore(IMAGE_CACHE, ServeSettings().executor_source)
    key = store.plan(load_templates(first)["tools"])[-2][0]
    assert store.plan(load_templates(second)["tools"])[-2][0] == key  # the same files elsewhere: the same layer
    (second / "files/app/hello.txt").write_text("changed\n")
    assert store.plan(load_templates(second)["tools"])[-2][0] != key
    os.chmod(first / "files/app/sub/run.sh", 0o755)  # a mode is part of what is copied
    assert _copy_layer(first).files != layer.files


@pytest.mark.parametrize(
    ("source", "refusal"),
    [
        ("../outside", "is outside the templates directory"),
        ("/etc", "a path relative to the templates directory"),
        ("files/missing", "no such file or directory"),
        ("files/escape", "is outside the templates directory"),  # a symlink out of it
    ],
)
def test_a_copy_source_outside_the_templates_directory_or_missing_is_refused(
    tmp_path: Path, source: str, refusal: str
) -> None:
    directory = templates_with_copy(tmp_path / "templates", source)
    (tmp_path / "outside").mkdir()
    (directory / "files/escape").symlink_to(tmp_path / "outside")
    with pytest.raises(TemplateError, match=f"template 'tools': copy source '{source}'.*{refusal}"):
        load_templates(directory)


def test_the_archive_holds_the_source_under_its_name_and_refuses_files_edited_since_loading(tmp_path: Path) -> None:
    directory = templates_with_copy(tmp_path / "templates")
    (directory / "files/app/link").symlink_to("/etc/passwd")  # kept as a link: nothing outside is read
    layer = _copy_layer(directory)
    with tarfile.open(fileobj=io.BytesIO(pack_context(directory, layer.source, layer.files))) as archive:
        members = {member.name: member for member in archive.getmembers()}
    assert sorted(members) == ["files/app", "files/app/hello.txt", "files/app/link", "files/app/sub",
                               "files/app/sub/run.sh"]  # fmt: skip
    assert members["files/app/link"].issym()
    (directory / "files/app/hello.txt").write_text("edited\n")
    with pytest.raises(ContextError, match="changed since the templates were loaded"):
        pack_context(directory, layer.source, layer.files)
