"""`sudo` inside a real sandbox, as an agent's commands use it: passwordless to root, and never beyond root inside."""

from __future__ import annotations

import pytest
from e2b import CommandExitException, Sandbox

from tests.executor_fixtures import Envd, envd_fixture  # noqa: F401 - fixtures


@pytest.fixture
def sandbox(envd: Envd) -> Sandbox:
    return envd.sandbox()


def _run(sandbox: Sandbox, command: str, user: str = "user") -> tuple[int, str, str]:
    try:
        result = sandbox.commands.run(command, user=user)
    except CommandExitException as failed:
        return failed.exit_code, failed.stdout, failed.stderr
    return result.exit_code, result.stdout, result.stderr


def test_sudo_runs_the_command_as_root_without_a_password(sandbox: Sandbox) -> None:
    assert _run(sandbox, "sudo id -u; sudo -n -u user id -un; sudo -i pwd") == (0, "0\nuser\n/root\n", "")


def test_sudo_passes_on_stdin_the_exit_status_and_signals(sandbox: Sandbox) -> None:
    assert _run(sandbox, "echo piped | sudo cat")[1] == "piped\n"
    assert _run(sandbox, "sudo sh -c 'exit 7'")[0] == 7
    started = "until [ -e /tmp/sudo-started ]; do sleep 0.1; done"  # the command runs: sudo passes signals on
    interrupted = f"rm -f /tmp/sudo-started; sudo sh -c 'touch /tmp/sudo-started; exec sleep 60' & pid=$!; {started}"
    interrupted += "; kill -INT $pid; wait $pid; echo $?"
    assert _run(sandbox, interrupted)[1] == "130\n"  # the command died of the SIGINT sudo passed on


def test_sudo_cannot_do_what_root_inside_cannot(sandbox: Sandbox) -> None:
    """Its root is the sandbox's root: the same capabilities, seccomp filter and no_new_privs, so no mount."""
    status = "grep -E '^(CapEff|NoNewPrivs|Seccomp):' /proc/self/status"
    assert _run(sandbox, f"sudo {status}")[1] == _run(sandbox, status, user="root")[1]
    assert "NoNewPrivs:\t1" in _run(sandbox, f"sudo {status}")[1]
    assert _run(sandbox, "sudo mount -t tmpfs none /mnt")[0] != 0
    assert _run(sandbox, "mount -t tmpfs none /mnt", user="root")[0] != 0


def test_sudo_is_refused_to_accounts_that_are_not_allowed(sandbox: Sandbox) -> None:
    _run(sandbox, "id svc || useradd svc", user="root")
    code, _, stderr = _run(sandbox, "runuser -u svc -- sudo id -u", user="root")
    assert (code, stderr) == (1, "sudo: svc is not allowed to run sudo in this sandbox\n")


def test_an_unsupported_option_is_refused_with_a_clear_message(sandbox: Sandbox) -> None:
    code, _, stderr = _run(sandbox, "sudo -g users id")
    assert code == 1
    assert stderr.startswith("sudo: option '-g' is not supported in this sandbox")
