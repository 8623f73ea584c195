"""What the host takes back out of a sandbox's writable layer (its DNS address, CAs, the `python` link, the
executor's log) before the layer becomes a template's or a snapshot's: only those files, and never through a
link the sandbox planted, which would make host root delete the host's own files."""

from __future__ import annotations

import os
from pathlib import Path

from pool._local._launcher import EXECUTOR_LOG
from pool._local._sandbox_files import SandboxFiles, unlink_beneath


def _files() -> SandboxFiles:
    return SandboxFiles(ca_certs=None, dns_address="192.0.2.53")


def test_the_files_written_for_the_sandbox_are_taken_back_and_the_sandboxs_own_stay(tmp_path: Path) -> None:
    layer, upper = tmp_path / "layer", tmp_path / "upper"
    (layer / "usr/bin").mkdir(parents=True)
    (layer / "usr/bin/python3").write_text("")
    upper.mkdir()
    _files().write(upper, os.getuid(), [layer])
    (upper / "etc/hosts").write_text("the sandbox's own\n")
    _files().take_back(upper, [layer])
    assert not (upper / "etc/resolv.conf").exists()
    assert not os.path.lexists(upper / "usr/local/bin/python")
    assert (upper / "etc/hosts").read_text() == "the sandbox's own\n"


def test_a_file_the_sandbox_changed_is_its_own_and_stays(tmp_path: Path) -> None:
    upper = tmp_path / "upper"
    upper.mkdir()
    _files().write(upper, os.getuid(), [])
    (upper / "etc/resolv.conf").write_text("nameserver 203.0.113.1\n")
    _files().take_back(upper, [])
    assert (upper / "etc/resolv.conf").read_text() == "nameserver 203.0.113.1\n"


def test_no_link_in_the_sandboxs_files_is_followed_to_the_hosts(tmp_path: Path) -> None:
    host, upper = tmp_path / "host", tmp_path / "upper"
    (host / "bin").mkdir(parents=True)
    (host / "bin/python").symlink_to("/usr/bin/python3")  # the host's own link, as the sandbox's would be
    (host / "log").mkdir()
    (host / "log/agent-sandbox-executor.log").write_text("the host's\n")
    (upper / "usr/local").mkdir(parents=True)
    (upper / "usr/local/bin").symlink_to(host / "bin")  # planted by root inside the sandbox
    (upper / "var").symlink_to(host)
    layer = tmp_path / "layer"
    (layer / "usr/bin").mkdir(parents=True)
    (layer / "usr/bin/python3").write_text("")
    _files().take_back(upper, [layer])
    unlink_beneath(upper, EXECUTOR_LOG.lstrip("/"))
    assert os.path.islink(host / "bin/python")
    assert (host / "log/agent-sandbox-executor.log").read_text() == "the host's\n"
