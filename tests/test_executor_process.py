"""process.Process through the real e2b SDK: commands, stdin, signals, PTYs, streams."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from e2b import (
    AuthenticationException,
    CommandExitException,
    InvalidArgumentException,
    NotFoundException,
    PtySize,
    TimeoutException,
)

from tests.executor_fixtures import Envd, envd_fixture, workdir_fixture  # noqa: F401 - fixtures


def _started(sandbox: Any, command: str, **options: Any) -> Any:
    """Run `echo ready; <command>` in the background and return once `ready` arrived.

    Killing a `bash -l` while its profile still runs could leave the host's profile scripts
    half done (pyenv's rehash lock, for one): the kill tests wait for the command proper.
    """
    handle = sandbox.commands.run(f"echo ready; {command}", background=True, **options)
    _stdout_until(iter(handle), "ready\n")
    return handle


def _stdout_until(events: Iterator[Any], marker: str) -> str:
    """Consume stdout (or PTY output) events until `marker` has been seen."""
    seen = ""
    for stdout, _, pty in events:
        seen += stdout or (pty or b"").decode(errors="replace")
        if marker in seen:
            return seen
    raise AssertionError(f"{marker!r} never arrived; got {seen!r}")


def test_foreground_command_returns_output_and_exit_code(envd: Envd) -> None:
    result = envd.sandbox().commands.run("echo out; echo err >&2")
    assert (result.stdout, result.stderr, result.exit_code, result.error) == ("out\n", "err\n", 0, None)


def test_nonzero_exit_raises_with_code_output_and_status(envd: Envd) -> None:
    with pytest.raises(CommandExitException) as caught:
        envd.sandbox().commands.run("echo partial; echo bad >&2; exit 3")
    assert (caught.value.exit_code, caught.value.stdout, caught.value.stderr) == (3, "partial\n", "bad\n")
    assert caught.value.error == "exit status 3"


def test_background_output_arrives_incrementally(envd: Envd) -> None:
    sandbox = envd.sandbox()
    handle = sandbox.commands.run("echo first; read line; echo second $line", background=True, stdin=True)
    events = iter(handle)
    assert _stdout_until(events, "first\n") == "first\n"  # before any input exists, so it streamed
    sandbox.commands.send_stdin(handle.pid, "go\n")
    assert _stdout_until(events, "second go\n") == "second go\n"
    assert handle.wait().exit_code == 0


def test_send_stdin_then_close_stdin_ends_the_reader(envd: Envd) -> None:
    sandbox = envd.sandbox()
    handle = sandbox.commands.run("cat", background=True, stdin=True)
    sandbox.commands.send_stdin(handle.pid, "abc")
    sandbox.commands.send_stdin(handle.pid, b"def")
    sandbox.commands.close_stdin(handle.pid)
    assert handle.wait().stdout == "abcdef"


def test_stream_input_feeds_stdin_in_order(envd: Envd) -> None:
    sandbox = envd.sandbox()
    handle = sandbox.commands.run("cat", background=True, stdin=True)
    sandbox.commands.stream_input(handle.pid, ["one ", b"two ", "three"])
    sandbox.commands.close_stdin(handle.pid)
    assert handle.wait().stdout == "one two three"


def test_stdin_is_dev_null_unless_requested(envd: Envd) -> None:
    assert envd.sandbox().commands.run("cat; echo done").stdout == "done\n"


def test_kill_ends_the_process_with_signal_status(envd: Envd) -> None:
    sandbox = envd.sandbox()
    handle = _started(sandbox, "sleep 300")
    assert sandbox.commands.kill(handle.pid) is True
    with pytest.raises(CommandExitException) as caught:
        handle.wait()
    assert (caught.value.exit_code, caught.value.error) == (-1, "signal: killed")
    assert handle.pid not in [process.pid for process in sandbox.commands.list()]


def test_kill_of_unknown_pid_returns_false(envd: Envd) -> None:
    assert envd.sandbox().commands.kill(999_999) is False


def test_kill_reaches_the_whole_process_group_and_orphans_are_reaped(envd: Envd) -> None:
    sandbox = envd.sandbox()
    handle = sandbox.commands.run("sleep 300 & echo $!; wait", background=True)
    child = int(_stdout_until(iter(handle), "\n"))
    sandbox.commands.kill(handle.pid)
    # `kill -0` succeeds on a zombie too, so this also shows the executor reaped the orphan.
    gone = sandbox.commands.run(f"timeout 10 sh -c 'while kill -0 {child} 2>/dev/null; do sleep 0.02; done'")
    assert gone.exit_code == 0


def test_list_shows_running_commands_with_their_config(envd: Envd, workdir: str) -> None:
    sandbox = envd.sandbox()
    handle = _started(sandbox, "sleep 300", envs={"MARK": "x"}, cwd=workdir)
    try:
        listed = {process.pid: process for process in sandbox.commands.list()}
        assert listed[handle.pid].cmd == "/bin/bash"
        assert listed[handle.pid].args == ["-l", "-c", "echo ready; sleep 300"]
        assert listed[handle.pid].envs == {"MARK": "x"}
        assert listed[handle.pid].cwd == workdir
    finally:
        sandbox.commands.kill(handle.pid)


def test_connect_from_a_second_stream_gets_the_later_output(envd: Envd) -> None:
    sandbox = envd.sandbox()
    first = sandbox.commands.run("read line; echo got $line", background=True, stdin=True)
    second = sandbox.commands.connect(first.pid)
    sandbox.commands.send_stdin(first.pid, "hello\n")
    assert second.wait().stdout == "got hello\n"
    assert first.wait().stdout == "got hello\n"


def test_disconnecting_the_start_stream_leaves_the_process_running(envd: Envd) -> None:
    sandbox = envd.sandbox()
    handle = sandbox.commands.run("read line; echo still here $line", background=True, stdin=True)
    handle.disconnect()
    again = sandbox.commands.connect(handle.pid)
    sandbox.commands.send_stdin(handle.pid, "yes\n")
    assert again.wait().stdout == "still here yes\n"


def test_envs_and_cwd_are_applied(envd: Envd, workdir: str) -> None:
    result = envd.sandbox().commands.run('echo "$GREETING $HOME $USER"; pwd', envs={"GREETING": "hi"}, cwd=workdir)
    assert result.stdout == f"hi {envd.default_home} {envd.default_user}\n{workdir}\n"


def test_missing_cwd_is_an_invalid_argument(envd: Envd) -> None:
    with pytest.raises(InvalidArgumentException, match="does not exist"):
        envd.sandbox().commands.run("true", cwd="/nonexistent/dir")


def test_unknown_user_is_rejected_as_unauthenticated(envd: Envd) -> None:
    with pytest.raises(AuthenticationException, match="invalid username"):
        envd.sandbox().commands.run("true", user="no-such-user")


def test_named_user_runs_the_command_as_that_user(envd: Envd) -> None:
    result = envd.sandbox().commands.run("id -un; echo $HOME", user="nobody")
    assert result.stdout.split("\n")[0] == "nobody"


def test_timeout_kills_the_command_and_raises_timeout(envd: Envd) -> None:
    sandbox = envd.sandbox()
    handle = _started(sandbox, "sleep 300", timeout=2)
    with pytest.raises(TimeoutException):
        handle.wait()
    # The kill timer fires just after the stream's deadline: the process is dying or already gone.
    with pytest.raises((CommandExitException, NotFoundException)):
        sandbox.commands.connect(handle.pid, timeout=10).wait()


def test_pty_output_input_and_resize(envd: Envd) -> None:
    sandbox = envd.sandbox()
    handle = sandbox.pty.create(PtySize(rows=24, cols=80), envs={"PS1": "$ "})
    events = iter(handle)
    sandbox.pty.send_stdin(handle.pid, b"stty size; tty\n")
    assert "24 80" in _stdout_until(events, "/dev/pts/")
    sandbox.pty.resize(handle.pid, PtySize(rows=30, cols=100))
    sandbox.pty.send_stdin(handle.pid, b"stty size\n")
    _stdout_until(events, "30 100")
    sandbox.pty.send_stdin(handle.pid, b"exit 0\n")
    assert handle.wait().exit_code == 0
