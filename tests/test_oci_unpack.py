"""An image's layer tars applied into one directory (`pool._local._oci_unpack`): OCI whiteouts remove what the
layers below put there, and no entry reaches outside the directory, however its tar is crafted. Also what the
sandbox needs of the unpacked root (`_oci_root`) and how references are read (`_oci.parse_reference`)."""

from __future__ import annotations

import io
import os
import stat
import tarfile
from pathlib import Path

import pytest

from pool._local._oci import ImageReference, parse_reference
from pool._local._oci_root import ImageUnfit, inspect_root, prepare_root
from pool._local._oci_unpack import UnpackStats, UnsafeImage, apply_layer, resolve_in_root

Entry = tuple[str, str, bytes | str]  # (name, kind: file | dir | symlink | hardlink | chardev, content or target)


def _layer(path: Path, entries: list[Entry], xattrs: dict[str, str] | None = None) -> Path:
    with tarfile.open(path, "w", format=tarfile.PAX_FORMAT) as tar:
        for name, kind, content in entries:
            info = tarfile.TarInfo(name)
            info.mtime = 1_700_000_000
            if kind == "file":
                data = content if isinstance(content, bytes) else content.encode()
                info.size, info.mode = len(data), 0o644
                if xattrs:
                    info.pax_headers = {f"SCHILY.xattr.{k}": v for k, v in xattrs.items()}
                tar.addfile(info, io.BytesIO(data))
                continue
            info.type, info.mode = {
                "dir": (tarfile.DIRTYPE, 0o755), "symlink": (tarfile.SYMTYPE, 0o777),
                "hardlink": (tarfile.LNKTYPE, 0o644), "chardev": (tarfile.CHRTYPE, 0o666),
            }[kind]  # fmt: skip
            if kind in ("symlink", "hardlink"):
                info.linkname = str(content)
            tar.addfile(info)
    return path


def _apply(tmp_path: Path, root: Path, *layers: list[Entry]) -> UnpackStats:
    stats = UnpackStats()
    for index, entries in enumerate(layers):
        apply_layer(_layer(tmp_path / f"layer{index}.tar", entries), root, stats)
    return stats


@pytest.fixture
def root(tmp_path: Path) -> Path:
    made = tmp_path / "root"
    made.mkdir()
    return made


def test_whiteouts_remove_what_the_layers_below_put_there_and_opaque_dirs_keep_only_their_own(
    tmp_path: Path, root: Path
) -> None:
    _apply(
        tmp_path, root,
        [("etc", "dir", ""), ("etc/motd", "file", "hi"), ("etc/keep", "file", "k"), ("srv", "dir", ""),
         ("srv/old", "file", "o"), ("srv/sub", "dir", ""), ("srv/sub/deep", "file", "d")],
        # The opaque marker after the layer's own entry: it hides the lower entries only, whatever the order.
        [("etc/.wh.motd", "file", ""), ("srv/new", "file", "n"), ("srv/.wh..wh..opq", "file", ""),
         ("srv/.wh.never-there", "file", ""), ("etc/.wh..wh.plnk", "file", "")],
    )  # fmt: skip
    assert sorted(os.listdir(root / "etc")) == ["keep"]
    assert sorted(os.listdir(root / "srv")) == ["new"]
    assert not any(name.startswith(".wh.") for _, _, names in os.walk(root) for name in names)


def test_a_later_layer_replaces_an_entry_of_another_kind_and_merges_directories(tmp_path: Path, root: Path) -> None:
    _apply(
        tmp_path, root,
        [("a", "file", "file first"), ("d", "dir", ""), ("d/one", "file", "1"), ("link", "symlink", "/etc")],
        [("a", "dir", ""), ("a/inside", "file", "x"), ("d", "dir", ""), ("d/two", "file", "2"),
         ("link", "file", "now a file")],
    )  # fmt: skip
    assert (root / "a/inside").read_text() == "x"
    assert sorted(os.listdir(root / "d")) == ["one", "two"]
    assert not (root / "link").is_symlink()
    assert (root / "link").read_text() == "now a file"


def test_symlinks_are_followed_inside_the_root_never_out_of_it(tmp_path: Path, root: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "victim").write_text("untouched")
    _apply(
        tmp_path, root,
        [("usr", "dir", ""), ("usr/lib", "dir", ""), ("lib", "symlink", "usr/lib"),
         ("escape", "symlink", str(outside)), ("climb", "symlink", "../../../../../../" + str(outside)),
         ("abs-etc", "symlink", "/etc")],
        [("lib/libfoo.so", "file", "through usrmerge"), ("escape/victim", "file", "overwritten?"),
         ("climb/victim", "file", "overwritten?"), ("abs-etc/passwd", "file", "the image's own")],
    )  # fmt: skip
    assert (outside / "victim").read_text() == "untouched"
    assert (root / "usr/lib/libfoo.so").read_text() == "through usrmerge"
    assert (root / str(outside).lstrip("/") / "victim").read_text() == "overwritten?"  # clamped into the root
    assert (root / "etc/passwd").read_text() == "the image's own"
    assert Path("/etc/passwd").read_text() != "the image's own"
    assert os.readlink(root / "abs-etc") == "/etc"  # kept as the image made it: it resolves inside a sandbox


def test_a_whiteout_through_a_symlink_removes_inside_the_root_only(tmp_path: Path, root: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "precious").write_text("keep me")
    _apply(tmp_path, root, [("out", "symlink", str(outside))], [("out/.wh.precious", "file", ""),
                                                                ("out/.wh..wh..opq", "file", "")])  # fmt: skip
    assert (outside / "precious").read_text() == "keep me"


@pytest.mark.parametrize(
    "entries",
    [
        [("../escaped", "file", "x")],
        [("a/../../escaped", "file", "x")],
        [("ok", "hardlink", "../../etc/passwd")],
        [("ok", "hardlink", "/no/such/file")],
        [("f", "file", "x"), ("f/below-a-file", "file", "x")],
    ],
)
def test_entries_that_would_reach_outside_or_cannot_be_applied_are_refused(
    tmp_path: Path, root: Path, entries: list[Entry]
) -> None:
    with pytest.raises(UnsafeImage):
        _apply(tmp_path, root, entries)
    assert not (tmp_path / "escaped").exists()


def test_absolute_names_land_inside_hard_links_stay_inside_and_devices_and_foreign_xattrs_are_dropped(
    tmp_path: Path, root: Path
) -> None:
    xattrs = {"user.origin": "image", "trusted.overlay.opaque": "y"}
    apply_layer(_layer(tmp_path / "x.tar", [("/abs/file", "file", "content")], xattrs), root, UnpackStats())
    _apply(tmp_path, root, [("abs/hard", "hardlink", "/abs/file"), ("dev", "dir", ""), ("dev/mem", "chardev", "")])
    assert (root / "abs/file").read_text() == "content"
    assert os.stat(root / "abs/hard").st_ino == os.stat(root / "abs/file").st_ino
    assert not os.path.lexists(root / "dev/mem")
    assert os.getxattr(root / "abs/file", "user.origin") == b"image"
    assert "trusted.overlay.opaque" not in os.listxattr(root / "abs/file")


def test_resolve_in_root_clamps_and_detects_loops(root: Path) -> None:
    (root / "a").symlink_to("b")
    (root / "b").symlink_to("a")
    (root / "up").symlink_to("../../..")
    with pytest.raises(UnsafeImage, match="too many levels"):
        resolve_in_root(root, ["a", "x"])
    assert resolve_in_root(root, ["up"]) == root


def _fake_debian(root: Path, *, python: str = "python3.11", bash: bool = True, musl: bool = False) -> None:
    for directory in ("usr/bin", "usr/sbin", "usr/lib/x86_64-linux-gnu", f"usr/local/lib/{python}"):
        (root / directory).mkdir(parents=True, exist_ok=True)
    (root / "lib").symlink_to("usr/lib")
    (root / "lib64").mkdir()
    if not musl:
        (root / "usr/lib/x86_64-linux-gnu/libc.so.6").write_bytes(b"\0GLIBC_2.17\0GLIBC_2.36\0GLIBC_2.4\0")
        (root / "usr/lib/x86_64-linux-gnu/ld-linux-x86-64.so.2").write_bytes(b"ld")
        (root / "lib64/ld-linux-x86-64.so.2").symlink_to("/lib/x86_64-linux-gnu/ld-linux-x86-64.so.2")
    for name in ("usr/sbin/useradd", *(["usr/bin/bash"] if bash else [])):
        (root / name).write_bytes(b"#!")
        (root / name).chmod(0o755)
    (root / "bin").symlink_to("usr/bin")
    binary = root / "usr/local/bin" / python
    binary.parent.mkdir(parents=True, exist_ok=True)
    binary.write_bytes(b"elf")
    binary.chmod(0o755)
    (root / "usr/local/bin/python3").symlink_to(python)


@pytest.mark.skipif(os.uname().machine != "x86_64", reason="the fake root is an x86_64 one")
def test_a_root_with_python_elsewhere_gets_usr_bin_python3_and_the_versions_are_read_from_files(root: Path) -> None:
    _fake_debian(root, python="python3.12")
    facts = prepare_root(root)
    assert (facts.python, facts.glibc) == ((3, 12), (2, 36))
    assert os.readlink(root / "usr/bin/python3") == "../local/bin/python3"
    assert resolve_in_root(root, ["usr", "bin", "python3"]) == root / "usr/local/bin/python3.12"
    assert stat.S_IMODE(os.stat(root / "tmp").st_mode) == 0o1777


@pytest.mark.skipif(os.uname().machine != "x86_64", reason="the fake root is an x86_64 one")
def test_a_root_without_what_the_sandbox_needs_is_unfit_and_says_what_is_missing(root: Path) -> None:
    _fake_debian(root, python="python3.9", bash=False, musl=True)
    with pytest.raises(ImageUnfit) as unfit:
        inspect_root(root)
    message = str(unfit.value)
    assert "bash" in message
    assert "python3 is 3.9" in message
    assert "glibc" in message
    assert "useradd" not in message


@pytest.mark.parametrize(
    ("image", "expected"),
    [
        ("ubuntu:24.04", ImageReference("docker.io", "library/ubuntu", "24.04", "")),
        ("python", ImageReference("docker.io", "library/python", "latest", "")),
        ("team/app:v1", ImageReference("docker.io", "team/app", "v1", "")),
        ("127.0.0.1:5000/deb/root:t", ImageReference("127.0.0.1:5000", "deb/root", "t", "")),
        ("localhost/x@sha256:" + "a" * 64, ImageReference("localhost", "x", "latest", "sha256:" + "a" * 64)),
        ("ghcr.io/o/r:1.2", ImageReference("ghcr.io", "o/r", "1.2", "")),
    ],
)
def test_references_are_read_as_docker_reads_them(image: str, expected: ImageReference) -> None:
    assert parse_reference(image) == expected
    assert parse_reference(image).loopback == expected.registry.startswith(("127.", "localhost"))
