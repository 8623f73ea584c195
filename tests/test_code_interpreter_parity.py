"""What E2B's code interpreter returns beyond text and PNG, through the real `e2b-code-interpreter` SDK.

Charts (`Result.chart`, from E2B's own extractor), DataFrame data (`Result.data`), figures whatever the
matplotlib backend, PIL images, the default contexts listed from the start, and contexts' working
directories. One sandbox serves the module; the first test runs before any code, on purpose.
"""

from __future__ import annotations

import base64
from collections.abc import Iterator

import pytest
from e2b import SandboxException
from e2b_code_interpreter import AsyncSandbox, Execution, Sandbox
from e2b_code_interpreter.charts import (
    BarChart,
    BoxAndWhiskerChart,
    ChartType,
    LineChart,
    PieChart,
    ScatterChart,
    SuperChart,
)

from tests.server_fixtures import RunningServer
from tests.test_code_interpreter_sdk import interpreter_sandbox


@pytest.fixture(scope="module")
def sbx(server: RunningServer) -> Iterator[Sandbox]:
    with interpreter_sandbox(server) as sandbox:
        yield sandbox


def pngs(execution: Execution) -> list[bytes]:
    return [base64.b64decode(result.png) for result in execution.results if result.png]


def test_the_default_contexts_are_listed_before_any_code_ran(sbx: Sandbox) -> None:
    contexts = sbx.list_code_contexts()
    assert sorted(context.language for context in contexts) == ["javascript", "python"]
    assert {context.cwd for context in contexts} == {"/home/user"}


def test_a_line_chart_comes_back_with_its_data(sbx: Sandbox) -> None:
    code = (
        "import matplotlib.pyplot as plt\n"
        "plt.plot([1, 2, 3], [4, 5, 6], label='sales')\nplt.plot([1, 2, 3], [1, 0, 1], label='costs')\n"
        "plt.title('Q1')\nplt.xlabel('month')\nplt.ylabel('amount (EUR)')\nplt.show()"
    )
    execution = sbx.run_code(code)
    assert execution.error is None
    [result] = execution.results
    assert result.png is not None
    chart = result.chart
    assert isinstance(chart, LineChart)
    assert chart.type == ChartType.LINE
    assert chart.title == "Q1"
    assert (chart.x_label, chart.y_label, chart.y_unit) == ("month", "amount (EUR)", "EUR")
    assert [(element.label, element.points) for element in chart.elements] == [
        ("sales", [(1.0, 4.0), (2.0, 5.0), (3.0, 6.0)]),
        ("costs", [(1.0, 1.0), (2.0, 0.0), (3.0, 1.0)]),
    ]


def test_bar_scatter_pie_and_box_charts_are_recognised(sbx: Sandbox) -> None:
    code = (
        "import matplotlib.pyplot as plt\n"
        "plt.figure(); plt.bar(['oslo', 'lima'], [3, 7]); plt.show()\n"
        "plt.figure(); plt.scatter([1, 2], [3, 4], label='points'); plt.show()\n"
        "plt.figure(); plt.pie([1, 3], labels=['a', 'b']); plt.show()\n"
        "plt.figure(); plt.boxplot([[1, 2, 3, 4, 5], [2, 4, 6, 8, 10]], tick_labels=['x', 'y'], patch_artist=True)\n"
        "plt.show()"
    )
    charts = [result.chart for result in sbx.run_code(code).results]
    bar, scatter, pie, box = charts
    assert isinstance(bar, BarChart)
    assert [(element.label, element.value) for element in bar.elements] == [("oslo", 3.0), ("lima", 7.0)]
    assert isinstance(scatter, ScatterChart)
    assert scatter.elements[0].points == [(1.0, 3.0), (2.0, 4.0)]
    assert isinstance(pie, PieChart)
    assert [(element.label, element.angle) for element in pie.elements] == [("a", 90.0), ("b", 270.0)]
    assert isinstance(box, BoxAndWhiskerChart)
    assert [(e.label, e.min, e.median, e.max) for e in box.elements] == [("x", 1.0, 3.0, 5.0), ("y", 2.0, 6.0, 10.0)]


def test_a_figure_with_several_axes_is_a_superchart(sbx: Sandbox) -> None:
    code = (
        "import matplotlib.pyplot as plt\nfig, (left, right) = plt.subplots(1, 2)\nfig.suptitle('both')\n"
        "left.plot([1, 2], [2, 1])\nright.bar(['a'], [1])\nplt.show()"
    )
    chart = sbx.run_code(code).results[0].chart
    assert isinstance(chart, SuperChart)
    assert chart.title == "both"
    assert [type(element) for element in chart.elements] == [LineChart, BarChart]


def test_a_dataframe_comes_back_as_data_by_column(sbx: Sandbox) -> None:
    code = (
        "import pandas as pd, numpy as np\n"
        "days = pd.to_datetime(['2024-01-01', '2024-01-02'])\n"
        "pd.DataFrame({'city': ['Oslo', 'Lima'], 'n': [1, np.nan], 'day': days})"
    )
    [result] = sbx.run_code(code).results
    assert result.is_main_result
    assert result.data == {
        "city": ["Oslo", "Lima"],
        "n": [1.0, None],
        "day": ["2024-01-01T00:00:00", "2024-01-02T00:00:00"],
    }
    assert result.html is not None  # the other formats stay


def test_figures_come_back_after_switching_to_agg(sbx: Sandbox) -> None:
    context = sbx.create_code_context()  # the backend switch stays in this context
    code = (
        "import matplotlib\nmatplotlib.use('Agg')\nimport matplotlib.pyplot as plt\n"
        "plt.figure(); plt.plot([1, 2], [3, 4]); plt.show()\n"
        "plt.figure(); plt.bar(['a', 'b'], [1, 2]); plt.savefig('/tmp/bars.png')"
    )
    execution = sbx.run_code(code, context=context)
    assert execution.error is None
    assert execution.logs.stderr == []  # no "FigureCanvasAgg is non-interactive" warning
    assert [type(result.chart) for result in execution.results] == [LineChart, BarChart]
    assert all(png.startswith(b"\x89PNG") for png in pngs(execution))
    assert len(pngs(execution)) == 2
    assert sbx.files.read("/tmp/bars.png", format="bytes").startswith(b"\x89PNG")
    assert sbx.run_code("plt.get_fignums()", context=context).text == "[]"  # shown figures are closed


def test_a_saved_pil_image_is_displayed(sbx: Sandbox) -> None:
    execution = sbx.run_code("from PIL import Image\nImage.new('RGB', (8, 4), 'red').save('/tmp/red.png')")
    assert execution.error is None
    [png] = pngs(execution)
    assert png.startswith(b"\x89PNG")
    assert sbx.files.read("/tmp/red.png", format="bytes").startswith(b"\x89PNG")


def test_a_context_runs_in_any_directory_the_user_may_enter(sbx: Sandbox) -> None:
    sbx.files.make_dir("/tmp/project/data")
    context = sbx.create_code_context(cwd="/tmp/project/data")
    assert sbx.run_code("import os; os.getcwd()", context=context).text == "/tmp/project/data"
    sbx.remove_code_context(context)


def test_a_directory_the_user_may_not_enter_is_a_clear_400(sbx: Sandbox) -> None:
    with pytest.raises(SandboxException, match="400 Bad Request: cwd '/root' is not a directory the user 'user' may"):
        sbx.create_code_context(cwd="/root")


def test_javascript_with_import_and_top_level_await_gives_its_value(sbx: Sandbox) -> None:
    sbx.files.write("/home/user/lib/greet.mjs", "export const greet = (name) => `hello ${name}`; export default 7;")
    code = (
        "import path from 'node:path'\nimport seven, { greet } from './lib/greet.mjs'\n"
        "const joined = await Promise.resolve(path.join('a', 'b'))\n"
        "function twice(n) { return n * 2 }\n`${greet(joined)} ${twice(seven)}`"
    )
    execution = sbx.run_code(code, language="js")
    assert execution.error is None, execution.error
    assert execution.text == "hello a/b 14"
    # what that cell declared stays, as after any other cell
    assert sbx.run_code("[joined, twice(2), typeof greet]", language="js").text == "[ 'a/b', 4, 'function' ]"


def test_a_rewritten_javascript_cell_leaves_globals_as_a_script_would(sbx: Sandbox) -> None:
    context = sbx.create_code_context(language="js")
    cells = [
        "// import nothing, but the word\nfunction helper() { return 1 }\n"
        "function main() { return helper() }\nvar v = 1",
        "await 0\nfunction helper() { return 2 }\nfor (var i = 0; i < 3; i++) {}",
        "var v = v + 1",  # a plain script again: `var` and `function` names are still redeclarable
        "import missing from 'no-such-package'",  # fails, and must not shadow the global `fetch`-like names
    ]
    for cell in cells:
        sbx.run_code(cell, context=context)
    assert sbx.run_code("[main(), helper.name, v, i, typeof missing, typeof fetch]", context=context).text == (
        "[ 2, 'helper', 2, 3, 'undefined', 'function' ]"
    )


def test_no_javascript_cell_can_break_its_context(sbx: Sandbox) -> None:
    context = sbx.create_code_context(language="js")
    unprintable = sbx.run_code("throw { get message() { throw 2 } }", context=context).error
    assert unprintable is not None
    assert sbx.run_code("await 0; const JSON = { shadowed: true }; JSON.shadowed", context=context).text == "true"
    imported = sbx.run_code(
        "import { setTimeout } from 'node:timers/promises'; await setTimeout(1, 'ok')", context=context
    )
    assert imported.text == "ok"
    # the context still answers, the global setTimeout is the callback one, and V8's message names a syntax error
    assert sbx.run_code("typeof globalThis.setTimeout(() => {}, 1)", context=context).text == "object"
    broken = sbx.run_code("let x = ;", context=context).error
    assert broken is not None
    assert broken.value == "Unexpected token ';'"


def test_a_typescript_import_is_kept_for_later_cells(sbx: Sandbox) -> None:
    context = sbx.create_code_context(language="ts")
    sbx.run_code("import { readFileSync } from 'node:fs'", context=context)
    assert sbx.run_code("typeof readFileSync", context=context).text == "function"


def test_a_dataframe_of_values_json_lacks_still_comes_back(sbx: Sandbox) -> None:
    code = (
        "import decimal, pandas as pd\n"
        "pd.DataFrame({'d': [decimal.Decimal('1.5')], 'p': [pd.Period('2024-01')], 't': [pd.NaT]})"
    )
    [result] = sbx.run_code(code).results
    assert result.data == {"d": [1.5], "p": ["2024-01"], "t": [None]}


def test_a_dict_or_list_value_also_comes_back_as_json(sbx: Sandbox) -> None:
    [result] = sbx.run_code("{'city': 'Oslo', 'n': [1, 2.5, float('nan')]}").results
    assert result.json == {"city": "Oslo", "n": [1, 2.5, None]}
    assert result.text == "{'city': 'Oslo', 'n': [1, 2.5, nan]}"
    assert sbx.run_code("(1, 2)").results[0].json is None  # a tuple is not E2B's JSON either


def test_the_kernel_startup_leaves_nothing_in_the_users_namespace(sbx: Sandbox) -> None:
    context = sbx.create_code_context()  # a fresh kernel: Out would hold the startup's value
    assert sbx.run_code("[len(Out), [n for n in globals() if 'agent' in n or 'Patch' in n]]", context=context).text == (
        "[0, []]"
    )


def test_a_javascript_error_after_an_await_names_the_users_line(sbx: Sandbox) -> None:
    execution = sbx.run_code("await null\n\nnull.boom", language="javascript")
    assert execution.error is not None
    assert execution.error.name == "TypeError"
    assert ":3" in execution.error.traceback  # line 3 of the cell, not of the rewritten code


def test_typescript_runs_with_its_types_stripped(sbx: Sandbox) -> None:
    code = (
        "interface Point { x: number; y: number }\nenum Axis { X, Y }\n"
        "const p: Point = await Promise.resolve({ x: 3, y: 4 })\n"
        "function norm(q: Point): number { return Math.hypot(q.x, q.y) }\nnorm(p) + Axis.Y"
    )
    execution = sbx.run_code(code, language="ts")
    assert execution.error is None, execution.error
    assert execution.text == "6"
    context = sbx.create_code_context(language="typescript")
    assert context.language == "typescript"
    assert sbx.run_code("const s: string = 'typed'; s.length", context=context).text == "5"


def test_r_runs_in_its_kernel_with_state_and_plots(sbx: Sandbox) -> None:
    sbx.run_code("x <- c(1, 2, 3, 10)", language="r")
    assert sbx.run_code("mean(x)", language="r").results[0].text == "[1] 4"  # IRkernel displays, as on E2B
    assert sbx.run_code('print("hello")', language="r").logs.stdout == ['[1] "hello"\n']
    plot = sbx.run_code("plot(x)", language="r")
    assert plot.error is None, plot.error
    assert any(png.startswith(b"\x89PNG") for png in pngs(plot))
    frame = sbx.run_code("data.frame(city = c('Oslo', 'Lima'), n = 1:2)", language="r").results[0]
    assert frame.html is not None
    assert "Lima" in frame.html
    error = sbx.run_code("stop('no such thing')", language="r").error
    assert error is not None
    assert "no such thing" in error.value


def test_r_gets_an_executions_env_vars_for_that_execution_only(sbx: Sandbox) -> None:
    env = {"FOO": 'say "hi" \\ ok', "_LEADING": "x"}  # quotes and a backslash; a name R must quote
    execution = sbx.run_code("cat(Sys.getenv('FOO'), Sys.getenv('_LEADING'))", language="r", envs=env)
    assert execution.logs.stdout == ['say "hi" \\ ok x']
    assert sbx.run_code("Sys.getenv('FOO', unset = 'default')", language="r").results[0].text == '[1] "default"'


def test_java_is_a_400_naming_what_the_template_runs(sbx: Sandbox) -> None:
    with pytest.raises(SandboxException, match="this sandbox runs python, javascript, bash, typescript, r"):
        sbx.run_code("1", language="java")


@pytest.mark.anyio
async def test_the_async_sdk_gets_charts_data_and_javascript_imports(e2b_env: RunningServer) -> None:
    sandbox = await AsyncSandbox.create()
    try:
        plot = await sandbox.run_code("import matplotlib.pyplot as plt\nplt.pie([1, 1], labels=['a', 'b'])\nplt.show()")
        assert isinstance(plot.results[0].chart, PieChart)
        frame = await sandbox.run_code("import pandas as pd\npd.DataFrame({'n': [3]})")
        assert frame.results[0].data == {"n": [3]}
        imported = await sandbox.run_code("import { join } from 'node:path'\njoin('x', 'y')", language="js")
        assert imported.text == "x/y"
    finally:
        await sandbox.kill()
