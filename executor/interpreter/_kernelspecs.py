"""The Jupyter kernel specs of the service (python, bash, R), written at start-up into its runtime directory.

Written rather than installed: a pip layer only installs packages, and the specs name the service's own
Python (the template's venv), whichever it is. The kernels' environment is the service's minus the
PYTHONPATH that put the executor's libraries on the service's path: user code must not import them.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

from jupyter_client.kernelspec import KernelSpecManager

__all__ = ("KERNELS", "kernel_environment", "write_kernel_specs")

KERNELS = {"python": "python3", "bash": "bash", "r": "ir"}
"""Language -> kernel spec name."""

_STARTUP = Path(__file__).with_name("kernel_startup.py")
"""What every Python kernel runs as it starts (charts, DataFrame data, figures whatever the backend)."""

_SPECS: dict[str, dict[str, Any]] = {
    "python3": {
        "argv": [
            sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}",
            "--HistoryManager.hist_file=:memory:",  # no history database in the user's home
            # `and None`: the value is None, which is not kept in `_` and `Out` (a trailing `;` is not honoured here)
            f"--IPKernelApp.exec_lines=__import__('runpy').run_path({str(_STARTUP)!r}) and None",
        ],
        "display_name": "Python 3",
        "language": "python",
        "metadata": {"debugger": False},
    },
    "ir": {  # Debian's r-cran-irkernel, as its own spec has it; offered where it is installed (`_contexts`)
        "argv": ["R", "--slave", "-e", "IRkernel::main()", "--args", "{connection_file}"],
        "display_name": "R",
        "language": "R",
    },
    "bash": {
        "argv": [sys.executable, "-m", "bash_kernel", "-f", "{connection_file}"],
        "display_name": "Bash",
        "language": "bash",
        "env": {"PS1": "$"},
    },
}  # fmt: skip


def write_kernel_specs(runtime: Path) -> Any:
    """Write the specs under `runtime` and return a KernelSpecManager that sees only them."""
    for name, spec in _SPECS.items():
        (runtime / "kernels" / name).mkdir(parents=True, exist_ok=True)
        (runtime / "kernels" / name / "kernel.json").write_text(json.dumps(spec))
    return KernelSpecManager(kernel_dirs=[str(runtime / "kernels")], ensure_native_kernel=False)


def kernel_environment() -> dict[str, str]:
    """What every kernel (and Node.js process) starts with: the venv first on PATH, matplotlib inline (PNG)."""
    env = {name: value for name, value in os.environ.items() if name != "PYTHONPATH"}
    venv_bin = os.path.dirname(sys.executable)  # `!pip`, `!python` in a cell mean the kernel's own
    env["PATH"] = os.pathsep.join(
        [venv_bin, *(p for p in env.get("PATH", os.defpath).split(os.pathsep) if p != venv_bin)]
    )
    env["MPLBACKEND"] = "module://matplotlib_inline.backend_inline"
    env["PYDEVD_DISABLE_FILE_VALIDATION"] = "1"  # silences debugpy's warning about frozen modules
    return env
