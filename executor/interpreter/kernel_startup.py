"""Run by every Python kernel as it starts (see `_kernelspecs`): what E2B's kernels add to IPython.

- `e2b/chart`: a displayed matplotlib figure's data, from E2B's own extractor (the `e2b-charts` package in
  the template), so that `Result.chart` has the line, bar, scatter, pie and box-and-whisker elements.
- `e2b/data`: a displayed DataFrame as columns (`Result.data`), as `DataFrame.to_dict(orient="list")` with
  timestamps in ISO form and non-finite numbers as null; none above `DATA_CELLS` cells.
- Figures come back whatever the backend: after `matplotlib.use("Agg")` (or any other non-inline backend),
  `plt.show()` displays the open figures and closes them, as the inline backend does, and figures still
  open when a cell ends (made and only `savefig`-ed, say) are displayed then.
- A PIL image that is shown, or saved to a file, is displayed (E2B does the same).
- A dict or list value also carries `application/json` (`Result.json`), as E2B's kernels give it.

It runs on the kernel's Python (the template's venv) through `runpy`, in a namespace of its own, so none of
its names land in the user's; it imports nothing of the executor and neither pandas nor matplotlib (types
are named, and modules patched when the user's code imports them), so a kernel starts as fast as before.
"""

from __future__ import annotations

import decimal
import importlib.abc
import importlib.machinery
import json
import math
import sys
import warnings
from collections.abc import Sequence
from types import ModuleType
from typing import Any

from IPython import get_ipython
from IPython.core.formatters import BaseFormatter
from IPython.display import display
from traitlets import ObjectName, Unicode

DATA_CELLS = 100_000
"""The largest DataFrame (rows x columns) whose data comes back as `Result.data`."""
JSON_BYTES = 1 << 20
"""The largest dict or list (encoded) that also comes back as `Result.json`."""

_INLINE = "inline"  # in the name of matplotlib-inline's backend, the kernels' default (MPLBACKEND)


def _figure_chart(figure: Any) -> dict[str, Any] | None:
    try:
        from e2b_charts import chart_figure_to_dict
    except ImportError:  # a template without e2b-charts: figures come back as PNG only
        return None
    try:
        with warnings.catch_warnings():  # pydantic's about numpy ticks, which would reach the cell's stderr
            warnings.simplefilter("ignore")
            chart: dict[str, Any] = chart_figure_to_dict(figure)
    except Exception:  # a figure the extractor does not understand still comes back as PNG
        return None
    return chart or None


def _cell(value: Any) -> Any:
    """A DataFrame cell as JSON can carry it: numbers, strings, booleans and null as they are, timestamps in
    ISO form, NaN, infinities and NaT as null, Decimals as floats, numpy scalars as Python's, lists and dicts
    cell by cell, anything else as its `str`."""
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if type(value).__name__ == "NaTType":  # pandas.NaT, which has an isoformat ("NaT")
        return None
    if isinstance(value, decimal.Decimal):
        return _cell(float(value))
    if isinstance(value, (list, tuple)):
        return [_cell(item) for item in value]
    if isinstance(value, dict):
        return {str(key): _cell(item) for key, item in value.items()}
    if hasattr(value, "isoformat"):  # pandas.Timestamp, datetime, date, time
        return value.isoformat()
    if getattr(value, "shape", None) == ():  # a numpy scalar
        return _cell(value.item())
    return str(value)


def _frame_data(frame: Any) -> dict[str, Any] | None:
    rows, columns = frame.shape
    if rows * columns > DATA_CELLS:
        return None
    try:
        with warnings.catch_warnings():  # pandas' about duplicate column names, which would reach the cell
            warnings.simplefilter("ignore")
            columns_data = frame.to_dict(orient="list")
        return {str(name): [_cell(value) for value in values] for name, values in columns_data.items()}
    except Exception:  # a frame pandas cannot turn into columns still comes back as HTML and text
        return None


def _json_value(value: Any) -> tuple[Any, dict[str, bool]] | None:
    """A dict or list as JSON (its cells as a DataFrame's: `_cell`), with the expanded-view metadata E2B sends;
    none above `JSON_BYTES` encoded."""
    try:
        data = _cell(value)
        if len(json.dumps(data)) > JSON_BYTES:
            return None
    except (TypeError, ValueError, RecursionError):
        return None
    return data, {"expanded": True}


class ChartFormatter(BaseFormatter):  # type: ignore[misc]
    """Matplotlib figures, found by class name: IPython takes `Figure` out of every formatter's registry
    whenever the inline backend is (re)activated, so it cannot be registered as a type."""

    format_type = Unicode("e2b/chart")
    print_method = ObjectName("_repr_e2b_chart_")
    _return_type = (dict,)

    def __call__(self, obj: Any) -> Any:
        if any(f"{cls.__module__}.{cls.__qualname__}" == "matplotlib.figure.Figure" for cls in type(obj).__mro__):
            return _figure_chart(obj)
        return super().__call__(obj)


class DataFormatter(BaseFormatter):  # type: ignore[misc]
    format_type = Unicode("e2b/data")
    print_method = ObjectName("_repr_e2b_data_")
    _return_type = (dict,)


def _show_figures(*_args: Any, **_kwargs: Any) -> None:
    """Display every open figure and close it, as the inline backend's `show` does."""
    from matplotlib import pyplot
    from matplotlib._pylab_helpers import Gcf
    from matplotlib.figure import Figure

    shell = get_ipython()
    try:
        shell.display_formatter.formatters["image/png"].lookup_by_type(Figure)
    except KeyError:  # the inline backend was never active in this kernel: it registered no PNG for figures
        from IPython.core.pylabtools import select_figure_formats

        select_figure_formats(shell, {"png"}, bbox_inches="tight")  # the inline backend's defaults
    for manager in sorted(Gcf.get_all_fig_managers(), key=lambda manager: manager.num):
        display(manager.canvas.figure)
    pyplot.close("all")


def _inline() -> bool:
    import matplotlib

    return _INLINE in str(matplotlib.get_backend())


def _patch_pyplot(pyplot: ModuleType) -> None:
    original = pyplot.show

    def show(*args: Any, **kwargs: Any) -> Any:
        if _inline():
            return original(*args, **kwargs)
        return _show_figures()

    show.__doc__ = original.__doc__
    pyplot.show = show  # type: ignore[attr-defined]


def _patch_pil(image: ModuleType) -> None:
    original_save = image.Image.save
    original_show = image.Image.show

    def save(self: Any, fp: Any, *args: Any, **kwargs: Any) -> Any:
        caller = sys._getframe(1).f_globals.get("__name__", "")
        if (isinstance(fp, str) or hasattr(fp, "__fspath__")) and not caller.startswith("matplotlib"):
            display(self)  # matplotlib's savefig saves through PIL: that figure is displayed as a figure
        return original_save(self, fp, *args, **kwargs)

    def show(self: Any, *args: Any, **kwargs: Any) -> None:
        display(self)  # no viewer to start in a sandbox

    save.__doc__, show.__doc__ = original_save.__doc__, original_show.__doc__
    image.Image.save = save
    image.Image.show = show


_PATCHES = {"matplotlib.pyplot": _patch_pyplot, "PIL.Image": _patch_pil}


class _PatchOnImport(importlib.abc.MetaPathFinder):
    """Patches a module of `_PATCHES` once the user's code has imported it."""

    def find_spec(self, name: str, path: Sequence[str] | None, target: ModuleType | None = None) -> Any:
        if name not in _PATCHES:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(name, path, target)
            if spec is not None and spec.loader is not None and hasattr(spec.loader, "exec_module"):
                spec.loader = _PatchingLoader(spec.loader, _PATCHES[name])
                return spec
        return None


class _PatchingLoader(importlib.abc.Loader):
    def __init__(self, loader: Any, patch: Any) -> None:
        self._loader = loader
        self._patch = patch

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        module: ModuleType | None = self._loader.create_module(spec)
        return module

    def exec_module(self, module: ModuleType) -> None:
        self._loader.exec_module(module)
        self._patch(module)

    def __getattr__(self, name: str) -> Any:  # get_source, get_code, is_package...: the real loader's
        return getattr(self._loader, name)


def _flush_figures() -> None:
    """At a cell's end, show the figures a non-inline backend left open (the inline one shows its own)."""
    if "matplotlib.pyplot" in sys.modules and not _inline():
        _show_figures()


def install() -> None:
    shell = get_ipython()
    formatters = shell.display_formatter.formatters
    formatters["e2b/chart"] = ChartFormatter(parent=shell.display_formatter)
    data = formatters["e2b/data"] = DataFormatter(parent=shell.display_formatter)
    for module in ("pandas", "pandas.core.frame"):  # DataFrame.__module__ is "pandas" from pandas 3 on
        data.for_type_by_name(module, "DataFrame", _frame_data)
    for container in (dict, list):  # E2B's: a dict or list value also comes back as `Result.json`
        formatters["application/json"].for_type(container, _json_value)
    for name, patch in _PATCHES.items():
        if name in sys.modules:
            patch(sys.modules[name])
    sys.meta_path.insert(0, _PatchOnImport())
    shell.events.register("post_execute", _flush_figures)


install()
