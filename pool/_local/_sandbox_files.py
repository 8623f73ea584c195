"""Files every local sandbox gets in its writable layer before its first process: DNS, the host's trust, pip.

* `/etc/resolv.conf` names the host's DNS forwarder inside the sandbox (`_egress_dns`).
* The host's extra CAs (`/usr/local/share/ca-certificates` unless the operator says otherwise): machines
  behind a TLS-intercepting proxy trust them, and so must their sandboxes, or every `pip install` fails on
  TLS. They go where `update-ca-certificates` keeps them and into the system bundle (what curl, OpenSSL and
  Python read), and `/etc/profile.d` points pip, requests and Node (which carry their own) at that bundle.
* `/etc/pip.conf` lets `pip install` work as users type it: E2B's templates accept it, Debian's
  EXTERNALLY-MANAGED marker would refuse it. And `python` runs python3 where the template has only the latter.

They live in the sandbox's own layer (root inside may change them, for itself only), cost well under a
millisecond per start, and change no template layer (those are content-hashed and shared).
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

__all__ = ["SandboxFiles", "unlink_beneath"]

_BUNDLE = "etc/ssl/certs/ca-certificates.crt"
_PROFILE = """# Written by agent-sandbox: tools that carry their own CA list use the system's, which has the host's CAs.
export SSL_CERT_FILE=/{bundle} REQUESTS_CA_BUNDLE=/{bundle} PIP_CERT=/{bundle} NODE_EXTRA_CA_CERTS=/{bundle}
"""
_PYTHON_LINK = "usr/local/bin/python"
_PIP_CONF = "[global]\nbreak-system-packages = true\ncert = /{bundle}\n"


class SandboxFiles:
    """Writes the files above into a new sandbox's upper directory, owned by the sandbox's root."""

    def __init__(self, *, ca_certs: Path | None, dns_address: str) -> None:
        """`ca_certs`: a directory of `*.crt` files or one PEM file; None: the template's CAs only."""
        self._dns = dns_address
        self._extra = _read_certs(ca_certs)
        self._bundles: dict[Path, bytes] = {}  # template bundle by layer directory (layers never change)

    def write(self, upper: Path, owner: int, layers: list[Path]) -> None:
        """Populate `upper` (blocking, small) for a sandbox over `layers` (top first)."""
        for relative, content in self._contents(layers).items():
            _write(upper, relative, content, owner)
        if _needs_python_link(layers):
            _directories(upper, "usr/local/bin", owner)
            link = upper / _PYTHON_LINK
            if not link.is_symlink():
                link.symlink_to("/usr/bin/python3")
                os.lchown(link, owner, owner)

    def take_back(self, upper: Path, layers: list[Path]) -> None:
        """Remove from `upper` what `write` put there and the sandbox left as it was: a build sandbox's writable
        layer becomes a template layer, which must not carry this machine's DNS address or CAs. `upper` is the
        sandbox's to shape: no link in it is followed (`unlink_beneath`)."""
        for relative, content in self._contents(layers).items():
            unlink_beneath(upper, relative, content=content)
        if _needs_python_link(layers):
            unlink_beneath(upper, _PYTHON_LINK, link_to="/usr/bin/python3")

    def _contents(self, layers: list[Path]) -> dict[str, bytes]:
        files: dict[str, bytes] = {
            "etc/resolv.conf": f"nameserver {self._dns}\noptions edns0 trust-ad\n".encode(),
            "etc/pip.conf": _PIP_CONF.format(bundle=_BUNDLE).encode(),
        }
        if self._extra:
            files[_BUNDLE] = self._bundle(layers) + b"\n" + b"\n".join(pem for _, pem in self._extra)
            files["etc/profile.d/agent-sandbox-ca.sh"] = _PROFILE.format(bundle=_BUNDLE).encode()
            for name, pem in self._extra:
                files[f"usr/local/share/ca-certificates/{name}"] = pem
        return files

    def _bundle(self, layers: list[Path]) -> bytes:
        found = _first(layers, _BUNDLE)
        if found is None:
            return b""
        if found not in self._bundles:
            self._bundles[found] = found.read_bytes()
        return self._bundles[found]


def _needs_python_link(layers: list[Path]) -> bool:
    return _first(layers, "usr/bin/python3") is not None and _first(layers, "usr/bin/python") is None


def _read_certs(source: Path | None) -> list[tuple[str, bytes]]:
    if source is None or not source.exists():
        return []
    files = sorted(source.rglob("*.crt")) if source.is_dir() else [source]
    return [(f.name if f.suffix == ".crt" else f"{f.name}.crt", f.read_bytes().strip()) for f in files]


def _first(layers: list[Path], relative: str) -> Path | None:
    """The file as the sandbox sees it: in the topmost layer that has it."""
    return next((layer / relative for layer in layers if os.path.lexists(layer / relative)), None)


def _directories(upper: Path, relative: str, owner: int) -> None:
    path = upper
    for part in Path(relative).parts:
        path = path / part
        if not path.is_dir():
            path.mkdir(mode=0o755)
            os.chown(path, owner, owner)


def _write(upper: Path, relative: str, content: bytes, owner: int) -> None:
    _directories(upper, str(Path(relative).parent), owner)
    target = upper / relative
    target.write_bytes(content)
    os.chown(target, owner, owner)
    target.chmod(0o644)


def unlink_beneath(root: Path, relative: str, *, content: bytes | None = None, link_to: str | None = None) -> None:
    """Remove `root/relative` if it is a regular file (holding `content`, when given) or a symbolic link (to
    `link_to`, when given), following no link on the way: a sandbox's files are its own to shape, and host root
    must not reach through a link of theirs to the host's. Whatever is not there, or not that, stays."""
    *parents, name = Path(relative).parts
    flags = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
    fds = [os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)]
    try:
        for part in parents:
            fds.append(os.open(part, flags, dir_fd=fds[-1]))
        where = fds[-1]
        mode = os.stat(name, dir_fd=where, follow_symlinks=False).st_mode
        if stat.S_ISLNK(mode):
            wanted = content is None and (link_to is None or os.readlink(name, dir_fd=where) == link_to)
        else:
            wanted = stat.S_ISREG(mode) and link_to is None and (content is None or _holds(where, name, content))
        if wanted:
            os.unlink(name, dir_fd=where)
    except OSError:  # not there, or a link or something else on the way
        return
    finally:
        for fd in fds:
            os.close(fd)


def _holds(directory_fd: int, name: str, content: bytes) -> bool:
    fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=directory_fd)
    with os.fdopen(fd, "rb") as f:
        return f.read(len(content) + 1) == content
