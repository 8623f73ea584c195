"""The code interpreter of E2B's `code-interpreter-v1` template: port 49999, run inside the sandbox.

`python -m executor.interpreter` serves e2b-protocol.md §4 (`/execute` streaming NDJSON, `/contexts`) on
the executor's HTTP server, with a Jupyter kernel per Python or bash context and a Node.js process per
JavaScript context. Unlike the rest of the executor it needs the template's venv (jupyter-client,
ipykernel, bash_kernel); nothing outside this subpackage imports it. See docs/code-interpreter.md.
"""

from executor.interpreter._main import main

__all__ = ("main",)
