"""The real `e2b` SDK's commands and PTY API against `agent-sandbox serve`."""

from __future__ import annotations

import re
import threading

import pytest
from e2b import CommandExitException, PtySize, Sandbox


def test_foreground_command_returns_output_and_exit_code(sbx: Sandbox) -> None:
    result = sbx.commands.run("echo out; echo err >&2", cwd="/tmp", envs={"X": "1"})
    assert result.stdout == "out\n"
    assert result.stderr == "err\n"
    assert result.exit_code == 0
    assert sbx.commands.run("pwd; echo $X", cwd="/tmp", envs={"X": "1"}).stdout == "/tmp\n1\n"


def test_non_zero_exit_raises_with_the_output(sbx: Sandbox) -> None:
    with pytest.raises(CommandExitException) as caught:
        sbx.commands.run("echo partial; exit 3")
    assert caught.value.exit_code == 3
    assert caught.value.stdout == "partial\n"


def test_background_output_arrives_incrementally(sbx: Sandbox) -> None:
    first_line = threading.Event()
    sbx.files.write("/tmp/release", "")  # the command waits until this file is removed
    lines: list[str] = []

    def on_stdout(chunk: str) -> None:
        lines.append(chunk)
        first_line.set()

    handle = sbx.commands.run(
        "echo first; while [ -e /tmp/release ]; do sleep 0.05; done; echo second", background=True
    )
    waiter = threading.Thread(target=lambda: handle.wait(on_stdout=on_stdout))
    waiter.start()
    assert first_line.wait(10), "the first line must arrive while the command still runs"
    assert "second" not in "".join(lines)
    sbx.files.remove("/tmp/release")
    waiter.join(10)
    assert "".join(lines) == "first\nsecond\n"


def test_stdin_is_forwarded_and_closed(sbx: Sandbox) -> None:
    handle = sbx.commands.run("cat", background=True, stdin=True)
    sbx.commands.send_stdin(handle.pid, "hello ")
    sbx.commands.send_stdin(handle.pid, "world\n")
    sbx.commands.close_stdin(handle.pid)
    assert handle.wait().stdout == "hello world\n"


def test_list_connect_and_kill_a_running_command(sbx: Sandbox) -> None:
    handle = sbx.commands.run("sleep 60", background=True)
    assert handle.pid in [p.pid for p in sbx.commands.list()]
    second = sbx.commands.connect(handle.pid)
    assert sbx.commands.kill(handle.pid) is True
    with pytest.raises(CommandExitException):
        second.wait()
    assert handle.pid not in [p.pid for p in sbx.commands.list()]
    assert sbx.commands.kill(handle.pid) is False


def test_pty_runs_an_interactive_shell_and_resizes(sbx: Sandbox) -> None:
    output = bytearray()
    seen = threading.Event()
    ended: list[BaseException] = []

    def on_data(data: bytes) -> None:
        output.extend(data)
        if re.search(rb"COLS=\d+", output):
            seen.set()

    def read_until_exit() -> None:
        try:
            terminal.wait(on_pty=on_data)
        except Exception as exc:  # killed below, the PTY ends with a signal: CommandExitException
            ended.append(exc)

    terminal = sbx.pty.create(PtySize(rows=24, cols=80))
    reader = threading.Thread(target=read_until_exit)
    reader.start()
    sbx.pty.resize(terminal.pid, PtySize(rows=30, cols=100))
    sbx.pty.send_stdin(terminal.pid, b"echo COLS=$(tput cols)\n")
    assert seen.wait(10), output.decode(errors="replace")
    assert b"COLS=100" in output
    assert sbx.pty.kill(terminal.pid) is True
    reader.join(10)
    assert [type(exc) for exc in ended] == [CommandExitException]
