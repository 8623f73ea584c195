"""A template build's COPY step, run as root inside the build sandbox by the sandbox's own Python (3.11.2+).

    python3 -I template_copy.py ARCHIVE SOURCE DEST USER MODE WORKDIR

ARCHIVE is the tar (gzip or not) the E2B SDK uploaded: the matched files, named relative to the build's
context directory. SOURCE is the step's path or glob inside it, DEST where the matches go, with Docker's COPY
rules: a directory's contents are merged into DEST; a file goes into DEST when DEST ends with `/`, is a
directory, or SOURCE matched several entries, else it becomes DEST. A relative DEST is under WORKDIR.
Whatever was copied (and the directories made for it) is then owned by USER ("" keeps root), and the files
get MODE (octal, "" keeps the archive's).
The archive is unpacked by GNU tar into a scratch directory, never over the root: its names cannot escape.
"""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import subprocess
import sys
import tempfile

__all__ = ["copy_step"]


def copy_step(archive: str, source: str, dest: str, user: str, mode: str, workdir: str) -> list[str]:
    """Copy, chown and chmod as the module says; the paths written, deepest last."""
    scratch = tempfile.mkdtemp(prefix=".template-copy-")
    try:
        if subprocess.run(["tar", "-xf", archive, "-C", scratch, "--no-same-owner"], check=False).returncode:
            raise SystemExit(f"COPY {source}: the uploaded files are not a tar archive tar can read")
        literal = os.path.join(scratch, source.lstrip("/"))  # a name like app/[id]/page.tsx is no pattern
        found = [literal] if os.path.lexists(literal) else glob.glob(literal, recursive=True, include_hidden=True)
        matches = sorted(found)
        if not matches:
            raise SystemExit(f"COPY {source}: no such file in the uploaded files")
        target = dest if os.path.isabs(dest) else os.path.join(workdir, dest)
        into = dest.endswith("/") or os.path.isdir(target) or len(matches) > 1
        written: list[str] = []
        for match in matches:
            if os.path.isdir(match) and not os.path.islink(match):
                written += _merge(match, target)
            else:
                written += _file(match, os.path.join(target, os.path.basename(match)) if into else target)
        _own(written, user, mode)
        return written
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def _merge(directory: str, target: str) -> list[str]:
    written = _parents(target)
    if not os.path.isdir(target):
        os.makedirs(target)
        written.append(target)
    for parent, dirs, files in os.walk(directory):
        relative = os.path.relpath(parent, directory)
        here = os.path.normpath(os.path.join(target, relative))
        for name in dirs:
            path = os.path.join(here, name)
            if os.path.islink(os.path.join(parent, name)):
                written += _file(os.path.join(parent, name), path)
            elif not os.path.isdir(path):  # a directory that is there already keeps its own mode and owner
                os.makedirs(path)
                shutil.copystat(os.path.join(parent, name), path)
                written.append(path)
        for name in files:
            written += _file(os.path.join(parent, name), os.path.join(here, name))
    return written


def _file(source: str, target: str) -> list[str]:
    written = _parents(target)
    if os.path.lexists(target) and not os.path.isdir(target):
        os.unlink(target)
    shutil.copy2(source, target, follow_symlinks=False)
    return [*written, target]


def _parents(target: str) -> list[str]:
    """Make the missing directories above `target`; those made."""
    made: list[str] = []
    parent = os.path.dirname(os.path.normpath(target))
    while parent and not os.path.isdir(parent):
        made.append(parent)
        parent = os.path.dirname(parent)
    for directory in reversed(made):
        os.mkdir(directory)
    return made[::-1]


def _own(paths: list[str], user: str, mode: str) -> None:
    if user:
        try:
            entry = pwd.getpwnam(user)
        except KeyError:
            raise SystemExit(f"COPY: there is no user {user!r} to own the files (a set_user step makes one)") from None
        for path in paths:
            os.lchown(path, entry.pw_uid, entry.pw_gid)
    if mode:  # files only: a directory given a file's mode (0644) could no longer be entered
        for path in paths:
            if not os.path.islink(path) and not os.path.isdir(path):
                os.chmod(path, int(mode, 8))


if __name__ == "__main__":
    copy_step(*sys.argv[1:7])
