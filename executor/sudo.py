#!/usr/bin/python3 -I
"""`sudo` of the sandbox (installed as /usr/local/bin/sudo): asks the executor to run the command (`_sudo`).

Passwordless, like E2B's: `sudo [-u user] [-E] [-H] [-n] [-S] [-i | -s] [--] command [args]`, plus `-v`, `-k`,
`-l` and `-V`. The environment is reset as Debian's sudoers does (env_reset, secure_path), keeping the
terminal and locale variables, unless `-E`; HOME, USER, LOGNAME and SHELL are the target user's, and
SUDO_USER, SUDO_UID, SUDO_GID and SUDO_COMMAND say who asked. Any other option is refused with status 1.
"""

from __future__ import annotations

import os
import pwd
import shlex
import signal
import socket
import sys
from dataclasses import dataclass, field

_HOME = os.path.dirname(os.path.dirname(os.path.realpath(__file__)))  # /opt/agent-sandbox: the package, its lib
sys.path[:0] = [_HOME, os.path.join(_HOME, "lib")]

from executor._sudo_wire import EXITED, MAX_REQUEST, REFUSED, SOCKET, STATUS  # noqa: E402 - after the path above

SECURE_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
KEPT = ("TERM", "COLORTERM", "COLORS", "DISPLAY", "LANG", "LANGUAGE", "TZ", "XAUTHORITY", "LS_COLORS")
FORWARDED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2)
USAGE = "usage: sudo [-u user] [-E] [-H] [-n] [-S] [-i | -s] [--] command [args...]"


@dataclass
class Options:
    user: str = "root"
    keep_env: bool = False
    shell: str = ""  # "-i" (login shell) or "-s"
    command: list[str] = field(default_factory=list)


def parse(argv: list[str]) -> Options | int:
    """The options, or the exit status for an option that ends here (-v, -k, -l, -V, a refusal)."""
    options, rest = Options(), list(argv)
    while rest and rest[0].startswith("-") and rest[0] != "-":
        flag = rest.pop(0)
        if flag == "--":
            break
        if flag in ("-u", "--user"):
            options.user = rest.pop(0) if rest else ""
        elif flag.startswith(("-u", "--user=")):
            options.user = flag.split("=", 1)[1] if flag.startswith("--") else flag[2:]
        elif flag in ("-E", "--preserve-env"):
            options.keep_env = True
        elif flag in ("-i", "--login", "-s", "--shell"):
            options.shell = "-i" if flag in ("-i", "--login") else "-s"
        elif flag in ("-H", "--set-home", "-n", "--non-interactive", "-S", "--stdin", "-k", "--reset-timestamp"):
            continue  # no password is ever asked, and HOME is always the target's
        elif flag in ("-v", "--validate"):
            return 0
        elif flag in ("-l", "--list"):
            print(f"User {pwd.getpwuid(os.getuid()).pw_name} may run the following commands on sandbox:")
            print("    (ALL : ALL) NOPASSWD: ALL")
            return 0
        elif flag in ("-V", "--version"):
            print("sudo of agent-sandbox (passwordless, served by the sandbox's executor)")
            return 0
        else:
            print(f"sudo: option '{flag}' is not supported in this sandbox\n{USAGE}", file=sys.stderr)
            return 1
    options.command = rest
    if not options.user:
        print(f"sudo: option -u needs a user\n{USAGE}", file=sys.stderr)
        return 1
    if not rest and not options.shell:
        return 0 if "-k" in argv or "--reset-timestamp" in argv else _usage()
    return options


def _usage() -> int:
    print(USAGE, file=sys.stderr)
    return 1


def request(options: Options) -> dict[str, object]:
    try:  # a name, or "#<uid>"
        target = pwd.getpwuid(int(options.user[1:])) if options.user.startswith("#") else pwd.getpwnam(options.user)
    except (KeyError, ValueError):
        print(f"sudo: unknown user {options.user}", file=sys.stderr)
        raise SystemExit(1) from None
    env = dict(os.environ) if options.keep_env else {k: v for k, v in os.environ.items() if _kept(k)}
    caller = pwd.getpwuid(os.getuid())
    shell = target.pw_shell or "/bin/sh"
    env |= {"PATH": SECURE_PATH, "HOME": target.pw_dir, "USER": target.pw_name, "LOGNAME": target.pw_name,
            "SHELL": shell, "SUDO_USER": caller.pw_name, "SUDO_UID": str(caller.pw_uid),
            "SUDO_GID": str(caller.pw_gid), "SUDO_COMMAND": shlex.join(options.command)}  # fmt: skip
    argv = options.command
    if options.shell:
        flags = ["-l"] if options.shell == "-i" else []
        argv = [shell, *flags, "-c", shlex.join(argv)] if argv else [shell, *flags]
    cwd = target.pw_dir if options.shell == "-i" else os.getcwd()
    return {"argv": argv, "user": target.pw_name, "env": env, "cwd": cwd}


def _kept(name: str) -> bool:
    return name in KEPT or name.startswith("LC_")


def run(payload: bytes) -> int:
    """Hand the request and our streams to the executor, pass signals on, and return the command's status."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET) as conn:
        try:
            conn.connect(SOCKET)
        except OSError as exc:
            print(f"sudo: the sandbox's sudo service is not reachable: {exc}", file=sys.stderr)
            return 1
        for number in FORWARDED:  # before the command can start: none of its signals is missed
            signal.signal(number, lambda received, _frame: conn.send(bytes([received])))
        socket.send_fds(conn, [payload], [0, 1, 2])
        answer = conn.recv(64 * 1024)
    if answer.startswith(EXITED):
        return int(STATUS.unpack(answer[1 : 1 + STATUS.size])[0])
    print(answer[1:].decode(errors="replace") if answer.startswith(REFUSED) else "sudo: no answer", file=sys.stderr)
    return 1


def main() -> int:
    import json

    options = parse(sys.argv[1:])
    if isinstance(options, int):
        return options
    payload = json.dumps(request(options)).encode()
    if len(payload) > MAX_REQUEST:
        print("sudo: argument list and environment too long", file=sys.stderr)
        return 1
    return run(payload)


if __name__ == "__main__":
    sys.exit(main())
