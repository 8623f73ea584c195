"""The real `e2b-code-interpreter` SDK against `agent-sandbox serve` and the `code-interpreter-v1` template.

One sandbox serves the module (creating one and starting its kernels costs about a second); tests that
break or reset a context make their own context, so the default ones stay as the other tests expect.
"""

from __future__ import annotations

import base64
import contextlib
import threading
from collections.abc import Iterator

import httpx
import pytest
from e2b import NotFoundException, TimeoutException
from e2b_code_interpreter import Execution, OutputMessage, Sandbox

from tests.polling import wait_for
from tests.server_fixtures import RunningServer

START = "PYTHONPATH=/opt/agent-sandbox/lib:/opt/agent-sandbox exec /opt/venv/bin/python -m executor.interpreter"


def interpreter_answers(server: RunningServer, sandbox_id: str) -> bool:
    headers = {"E2b-Sandbox-Id": sandbox_id, "E2b-Sandbox-Port": "49999"}
    try:
        return httpx.get(f"{server.url}/health", headers=headers, timeout=5).status_code == 200
    except httpx.TransportError:
        return False


def ensure_interpreter(server: RunningServer, sandbox: Sandbox) -> None:
    """The template's `start` runs the service; where the runtime does not run start commands yet, do it here."""
    if not interpreter_answers(server, sandbox.sandbox_id):
        sandbox.commands.run(START, background=True)
    wait_for(lambda: interpreter_answers(server, sandbox.sandbox_id), what="the interpreter service on port 49999")


@contextlib.contextmanager
def interpreter_sandbox(server: RunningServer) -> Iterator[Sandbox]:
    """A code-interpreter sandbox with its service answering, the SDK pointed at `server` meanwhile; killed after."""
    with pytest.MonkeyPatch.context() as patch:
        for name, value in server.e2b_env().items():
            patch.setenv(name, value)
        sandbox = Sandbox.create()
        try:
            ensure_interpreter(server, sandbox)
            yield sandbox
        finally:
            sandbox.kill()


@pytest.fixture(scope="module")
def sbx(server: RunningServer) -> Iterator[Sandbox]:
    with interpreter_sandbox(server) as sandbox:
        yield sandbox


def test_run_code_returns_the_value_of_the_last_expression(sbx: Sandbox) -> None:
    execution = sbx.run_code("1+1")
    assert execution.text == "2"
    assert execution.error is None
    assert execution.execution_count is not None


def test_state_is_kept_between_calls(sbx: Sandbox) -> None:
    sbx.run_code("kept = [1, 2, 3]")
    sbx.run_code("kept.append(4)")
    assert sbx.run_code("sum(kept)").text == "10"


def test_stdout_reaches_on_stdout_before_the_execution_ends(sbx: Sandbox) -> None:
    sbx.files.write("/tmp/release", "")  # the code waits until this file is removed
    first = threading.Event()
    messages: list[OutputMessage] = []
    executions: list[Execution] = []

    def on_stdout(message: OutputMessage) -> None:
        messages.append(message)
        first.set()

    code = "import os, time\nprint('first', flush=True)\nwhile os.path.exists('/tmp/release'): time.sleep(0.05)\n'done'"
    runner = threading.Thread(target=lambda: executions.append(sbx.run_code(code, on_stdout=on_stdout)))
    runner.start()
    assert first.wait(30), "the first line must arrive while the code still runs"
    assert runner.is_alive()
    sbx.files.remove("/tmp/release")
    runner.join(30)
    assert [message.line for message in messages] == ["first\n"]
    assert messages[0].timestamp
    assert executions[0].text == "done"


def test_stderr_and_stdout_are_collected_in_logs(sbx: Sandbox) -> None:
    execution = sbx.run_code("import sys\nprint('out')\nprint('err', file=sys.stderr)")
    assert execution.logs.stdout == ["out\n"]
    assert execution.logs.stderr == ["err\n"]


def test_an_exception_comes_back_with_its_traceback(sbx: Sandbox) -> None:
    execution = sbx.run_code("def f():\n    return 1 / 0\nf()")
    assert execution.error is not None
    assert execution.error.name == "ZeroDivisionError"
    assert execution.error.value == "division by zero"
    assert "f()" in execution.error.traceback
    assert sbx.run_code("'still usable'").text == "still usable"


def test_a_matplotlib_figure_comes_back_as_png(sbx: Sandbox) -> None:
    execution = sbx.run_code("import matplotlib.pyplot as plt\nplt.plot([1, 2, 3], [3, 1, 2])\nplt.show()")
    assert execution.error is None
    pngs = [result.png for result in execution.results if result.png]
    assert len(pngs) == 1
    assert base64.b64decode(pngs[0]).startswith(b"\x89PNG\r\n\x1a\n")
    assert not execution.results[0].is_main_result


def test_a_pandas_dataframe_comes_back_as_html_and_text(sbx: Sandbox) -> None:
    execution = sbx.run_code("import pandas as pd\npd.DataFrame({'city': ['Oslo', 'Lima'], 'n': [1, 2]})")
    result = execution.results[0]
    assert result.is_main_result
    assert result.html is not None
    assert "<table" in result.html
    assert "Lima" in result.html
    assert result.text is not None
    assert "Oslo" in result.text


def test_display_data_keeps_every_format_the_kernel_produced(sbx: Sandbox) -> None:
    code = (
        "from IPython.display import display, Markdown, Latex, JSON, SVG\n"
        "display(Markdown('**bold**'))\ndisplay(Latex(r'$\\alpha$'))\ndisplay(JSON({'a': 1}))\n"
        "display(SVG('<svg xmlns=\"http://www.w3.org/2000/svg\"/>'))"
    )
    results = sbx.run_code(code).results
    assert [r.markdown for r in results if r.markdown] == ["**bold**"]
    assert [r.latex for r in results if r.latex] == ["$\\alpha$"]
    assert [r.json for r in results if r.json] == [{"a": 1}]
    assert len([r.svg for r in results if r.svg]) == 1


def test_contexts_are_isolated_from_each_other(sbx: Sandbox) -> None:
    sbx.run_code("shared_name = 'default'")
    context = sbx.create_code_context(cwd="/tmp")
    assert context.language == "python"
    assert context.cwd == "/tmp"
    error = sbx.run_code("shared_name", context=context).error
    assert error is not None
    assert error.name == "NameError"
    assert sbx.run_code("import os; os.getcwd()", context=context).text == "/tmp"
    assert sbx.run_code("shared_name").text == "default"
    assert context.id in [listed.id for listed in sbx.list_code_contexts()]
    sbx.remove_code_context(context)


def test_restart_clears_a_context_and_remove_deletes_it(sbx: Sandbox) -> None:
    context = sbx.create_code_context()
    sbx.run_code("x = 1", context=context)
    sbx.restart_code_context(context)
    error = sbx.run_code("x", context=context).error
    assert error is not None
    assert error.name == "NameError"
    sbx.remove_code_context(context.id)
    assert context.id not in [listed.id for listed in sbx.list_code_contexts()]
    with pytest.raises(NotFoundException):
        sbx.run_code("1", context=context)


def test_javascript_runs_in_node_and_keeps_state(sbx: Sandbox) -> None:
    assert sbx.run_code("const answer = 6 * 7; answer", language="javascript").text == "42"
    execution = sbx.run_code("console.log('from node', answer); [answer, 'x']", language="js")
    assert execution.logs.stdout == ["from node 42\n"]
    assert execution.text == "[ 42, 'x' ]"
    error = sbx.run_code("null.property", language="js").error
    assert error is not None
    assert error.name == "TypeError"


def test_bash_runs_in_a_persistent_shell(sbx: Sandbox) -> None:
    sbx.run_code("cd /tmp && GREETING=hello", language="bash")
    assert sbx.run_code("echo $GREETING from $(pwd)", language="bash").logs.stdout == ["hello from /tmp\n"]


def test_env_vars_apply_to_one_execution_only(sbx: Sandbox) -> None:
    code = "import os; os.environ.get('PER_RUN', 'unset')"
    assert sbx.run_code(code, envs={"PER_RUN": "yes"}).text == "yes"
    assert sbx.run_code(code).text == "unset"
    assert sbx.run_code("process.env.PER_RUN", language="js", envs={"PER_RUN": "js"}).text == "js"


def test_a_timeout_interrupts_the_code_and_the_kernel_stays_usable(sbx: Sandbox) -> None:
    context = sbx.create_code_context()
    sbx.run_code("survivor = 5", context=context)
    with pytest.raises(TimeoutException):
        sbx.run_code("import time; time.sleep(30)", context=context, timeout=2)
    # Interrupted, not restarted: the variable is still there, long before the sleep would have ended.
    assert sbx.run_code("survivor", context=context, timeout=20).text == "5"
    sbx.remove_code_context(context)


def test_a_kernel_that_dies_is_restarted_and_the_error_says_so(sbx: Sandbox) -> None:
    context = sbx.create_code_context()
    error = sbx.run_code("import os; os._exit(3)", context=context).error
    assert error is not None
    assert error.name == "KernelDied"
    assert "restarted" in error.value
    assert sbx.run_code("1+1", context=context).text == "2"
    sbx.remove_code_context(context)


def test_sandbox_env_vars_reach_the_kernel(server: RunningServer, e2b_env: RunningServer) -> None:
    sandbox = Sandbox.create(envs={"FROM_CREATE": "sandbox-wide"})
    try:
        ensure_interpreter(server, sandbox)
        assert sandbox.run_code("import os; os.environ['FROM_CREATE']").text == "sandbox-wide"
    finally:
        sandbox.kill()


def test_the_sandbox_id_alone_does_not_run_code(server: RunningServer, sbx: Sandbox) -> None:
    """Port 49999 of a secure sandbox wants its access token, which the SDK sends: the security audit ran code and
    read the create's secrets with the id alone (ids are in hostnames, URLs and logs)."""
    headers = {"E2b-Sandbox-Id": sbx.sandbox_id, "E2b-Sandbox-Port": "49999"}
    body = {"code": "import os; print(os.getuid())"}
    refused = httpx.post(f"{server.url}/execute", headers=headers, json=body, timeout=30)
    assert refused.status_code == 401
    assert "access token" in refused.text
    wrong = httpx.post(f"{server.url}/execute", headers={**headers, "X-Access-Token": "x" * 32}, json=body, timeout=30)
    assert wrong.status_code == 401
    assert sbx.run_code("print(40 + 2)").logs.stdout == ["42\n"]
