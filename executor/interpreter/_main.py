"""The command line: `python -m executor.interpreter` serves the code interpreter of a sandbox on port 49999.

    python -m executor.interpreter [--host 0.0.0.0] [--port 49999] [--cwd DIR] [--execution-limit SECONDS]
                                   [--envd-port ENVD_PORT] [--node node] [--js-tools DIR]
                                   [--no-prestart]

Run with the template's venv Python (it has jupyter-client, ipykernel and bash_kernel) and the executor's
libraries on PYTHONPATH (templates/code-interpreter-v1.toml). SIGTERM stops every kernel and exits 0.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import shutil
import tempfile
from pathlib import Path

from executor._http import Connection, listen, stop_on_signals
from executor.envd import ENVD_PORT
from executor.interpreter._backend import Backend, BackendFactory
from executor.interpreter._contexts import JS_TOOLS, NODE_LANGUAGES, Contexts, offered_languages
from executor.interpreter._envd import EnvdClient
from executor.interpreter._service import Service, ServiceSettings

__all__ = ("main",)

logger = logging.getLogger("interpreter")


class _Connection(Connection):
    """The executor's HTTP connection, except that a client that half-closes counts as gone.

    No client of this service half-closes to wait for a response, while a proxy that drops the exchange
    (the gateway, when the SDK's `timeout` closes the stream) closes its end: treating that EOF as the end
    interrupts the kernel at once, instead of at the next keepalive write that fails.
    """

    def eof_received(self) -> bool:
        return False


def main(argv: list[str] | None = None) -> int:
    """Run the service until SIGTERM; the exit status."""
    options = _parse(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s interpreter %(levelname)s %(message)s")
    limit = options.execution_limit if options.execution_limit > 0 else None
    runtime = Path(tempfile.mkdtemp(prefix="agent-sandbox-interpreter-"))
    try:
        languages = offered_languages(options.js_tools)
        contexts = Contexts(backend_factory(runtime, options.node, options.js_tools), options.cwd, languages)
        service = Service(contexts, EnvdClient(port=options.envd_port), ServiceSettings(execution_limit=limit))
        return asyncio.run(_serve(options.host, options.port, service, contexts, prestart=not options.no_prestart))
    finally:
        shutil.rmtree(runtime, ignore_errors=True)


def backend_factory(runtime: Path, node: str, js_tools: str) -> BackendFactory:
    """Jupyter kernels for python and bash, a Node.js process for javascript and typescript."""
    from executor.interpreter._jupyter import JupyterBackend
    from executor.interpreter._kernelspecs import KERNELS, kernel_environment, write_kernel_specs
    from executor.interpreter._node import NodeBackend
    from executor.interpreter._node_driver import DRIVER

    specs = write_kernel_specs(runtime)
    env = kernel_environment()
    driver = runtime / "node-driver.js"
    driver.write_text(DRIVER)

    def create(language: str, cwd: str) -> Backend:
        if language in NODE_LANGUAGES:
            return NodeBackend(cwd, env, driver, node, tools=js_tools, language=language)
        return JupyterBackend(language, KERNELS[language], cwd, env, runtime, specs)

    return create


async def _serve(host: str, port: int, service: Service, contexts: Contexts, *, prestart: bool) -> int:
    loop = asyncio.get_running_loop()
    stop = stop_on_signals(loop)
    listener = listen(host, port, logger)
    if listener is None:
        return 1
    if prestart:
        # E2B's defaults, ready before the first execution and listed from the start
        for language in ("python", "javascript"):
            contexts.prestart(language)
    server = await loop.create_server(lambda: _Connection(service.handle), sock=listener)
    logger.info("listening on %s:%d", host, listener.getsockname()[1])
    await stop.wait()
    server.close()
    await contexts.close()
    return 0


def _parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m executor.interpreter", description="E2B code interpreter")
    parser.add_argument("--host", default="0.0.0.0", help="address to listen on (default: 0.0.0.0)")
    parser.add_argument("--port", type=int, default=49999, help="port to listen on (default: 49999; 0 picks one)")
    parser.add_argument("--cwd", default=os.path.expanduser("~"), help="working directory of new contexts (~)")
    parser.add_argument(
        "--execution-limit", type=float, default=3600.0, help="seconds an execution may run; 0: no limit (3600)"
    )
    parser.add_argument(
        "--envd-port", type=int, default=ENVD_PORT, help=f"the executor's port, for /envs ({ENVD_PORT})"
    )
    parser.add_argument("--node", default="node", help="the Node.js binary for JavaScript contexts (node)")
    parser.add_argument(
        "--js-tools", default=JS_TOOLS,
        help=f"node_modules with acorn (import, top-level await) and sucrase (TypeScript); '' for none ({JS_TOOLS})",
    )  # fmt: skip
    parser.add_argument(
        "--no-prestart", action="store_true", help="start the default Python and JavaScript contexts on first use only"
    )
    return parser.parse_args(argv)
