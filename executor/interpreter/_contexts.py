"""Contexts: the kernels code runs in, found by ID, plus one default context per language made on first use.

Executions of one context run one at a time (its lock); different contexts run side by side. An execution
is a task of the context, not of the HTTP request that asked for it: when the client leaves, the request's
task is cancelled and sets the execution's `stop`, while the execution's task goes on interrupting the
kernel and keeps the lock until the kernel is usable again, so the next execution never meets a busy one.
"""

from __future__ import annotations

import asyncio
import logging
import os
import pwd
import uuid
from collections.abc import Callable, Mapping

from executor.interpreter._backend import Backend, BackendFactory, BadRequest, ContextNotFound, InterpreterError
from executor.interpreter._wire import ContextInfo, Error, Line

__all__ = (
    "JS_TOOLS",
    "LANGUAGES",
    "NODE_LANGUAGES",
    "Context",
    "Contexts",
    "Sink",
    "normalize_language",
    "offered_languages",
)

logger = logging.getLogger("interpreter")

LANGUAGES = ("python", "javascript", "bash")
"""What every code-interpreter template runs; TypeScript needs the JavaScript tools (see `offered_languages`)."""
NODE_LANGUAGES = ("javascript", "typescript")
"""The languages a Node.js process runs."""
JS_TOOLS = "/opt/code-interpreter/node_modules"
"""Where the template installs acorn and sucrase (templates/code-interpreter-v1.toml)."""
R_KERNEL = "/usr/lib/R/site-library/IRkernel"
"""Where Debian's r-cran-irkernel is: R is offered where it is installed."""
_ALIASES = {"js": "javascript", "node": "javascript", "ts": "typescript", "sh": "bash", "python3": "python"}

_NOT_RUN = Error(
    name="ExecutionCancelled",
    value="The context was restarted or removed before this code ran",
    traceback="ExecutionCancelled: The context was restarted or removed before this code ran",
)

Sink = Callable[[Line | None], None]
"""Where an execution's lines go; None marks its end."""


def offered_languages(js_tools: str, r_kernel: str = R_KERNEL) -> tuple[str, ...]:
    """`LANGUAGES`, plus TypeScript where sucrase (which strips the types) is installed in `js_tools`, and R
    where its Jupyter kernel is."""
    typescript = bool(js_tools) and os.path.isdir(os.path.join(js_tools, "sucrase"))
    return (*LANGUAGES, *(["typescript"] if typescript else []), *(["r"] if os.path.isdir(r_kernel) else []))


def normalize_language(value: str | None, languages: tuple[str, ...] = LANGUAGES) -> str:
    """The reference's normalisation (lower case, `js` -> `javascript`, default python), limited to ours."""
    if not value:
        return "python"
    language = value.strip().lower()
    language = _ALIASES.get(language, language)
    if language not in languages:
        raise BadRequest(f"Unsupported language {value!r}: this sandbox runs {', '.join(languages)}")
    return language


class Context:
    """One kernel and the executions queued on it."""

    def __init__(self, info: ContextInfo, backend: Backend) -> None:
        self.info = info
        self._backend = backend
        self._lock = asyncio.Lock()  # held from before an execution starts until its kernel is usable again
        self._stops: set[asyncio.Event] = set()  # of the executions running or queued; owned by their tasks

    async def start(self) -> None:
        await self._backend.start()

    def submit(self, code: str, env: Mapping[str, str], sink: Sink, stop: asyncio.Event) -> asyncio.Task[None]:
        """Queue an execution; setting `stop` cancels it while queued and interrupts it while running."""
        self._stops.add(stop)
        return asyncio.create_task(self._execute(code, env, sink, stop))

    async def restart(self) -> None:
        """Stop what runs, then restart the kernel: its state is gone."""
        self._stop_all()
        async with self._lock:
            await self._backend.restart()

    async def close(self) -> None:
        self._stop_all()
        async with self._lock:
            await self._backend.close()

    async def _execute(self, code: str, env: Mapping[str, str], sink: Sink, stop: asyncio.Event) -> None:
        try:
            async with self._lock:
                if stop.is_set():  # the client left (nobody reads this) or the context is restarting or going away
                    sink(_NOT_RUN)
                else:
                    await self._backend.run(code, env, sink, stop)
        except InterpreterError as exc:
            sink(Error(name=type(exc).__name__, value=exc.message, traceback=f"{type(exc).__name__}: {exc.message}"))
        except Exception as exc:  # a bug of ours must still end the stream with an error, not a hang
            logger.exception("execution in context %s failed", self.info.id)
            sink(Error(name="InterpreterError", value=repr(exc), traceback=f"InterpreterError: {exc!r}"))
        finally:
            self._stops.discard(stop)
            sink(None)

    def _stop_all(self) -> None:
        for stop in self._stops:
            stop.set()


class Contexts:
    """Every context of the sandbox. Used from the event loop only, so its dicts need no lock."""

    def __init__(self, factory: BackendFactory, default_cwd: str, languages: tuple[str, ...] = LANGUAGES) -> None:
        self._factory = factory
        self._default_cwd = default_cwd
        self._languages = languages
        self._contexts: dict[str, Context] = {}
        self._defaults: dict[str, asyncio.Task[Context]] = {}  # language -> the (shared) creation of its default
        self._executions: set[asyncio.Task[None]] = set()  # referenced so that running ones are not collected

    async def create(self, language: str | None, cwd: str | None) -> Context:
        """Start a new context (its kernel is ready when this returns)."""
        language = normalize_language(language, self._languages)
        cwd = _directory(cwd or self._default_cwd)
        context = Context(ContextInfo(id=str(uuid.uuid4()), language=language, cwd=cwd), self._factory(language, cwd))
        await context.start()
        self._contexts[context.info.id] = context
        return context

    def get(self, context_id: str) -> Context:
        context = self._contexts.get(context_id)
        if context is None:
            raise ContextNotFound(f"Context {context_id} not found")
        return context

    async def default(self, language: str | None) -> Context:
        """The language's default context, created on first use (concurrent first uses share one)."""
        language = normalize_language(language, self._languages)
        task = self._defaults.get(language)
        if task is None or not self._usable(task):
            task = self._defaults[language] = asyncio.create_task(self.create(language, None))
            task.add_done_callback(_log_failure)
        return await asyncio.shield(task)  # a client that leaves must not cancel it for the others

    def _usable(self, task: asyncio.Task[Context]) -> bool:
        """Whether a default context's creation is under way or made one that still exists."""
        if not task.done():
            return True
        if task.cancelled() or task.exception() is not None:
            return False
        return task.result().info.id in self._contexts

    def prestart(self, language: str) -> None:
        """Start creating the default context now, so that the first execution does not wait for a kernel."""
        if language not in self._defaults:
            self._defaults[language] = asyncio.create_task(self.create(language, None))
            self._defaults[language].add_done_callback(_log_failure)

    async def infos(self) -> list[ContextInfo]:
        """Every context, defaults included (those still starting are waited for, as E2B lists its defaults
        from the start), in creation order."""
        starting = [task for task in self._defaults.values() if not task.done()]
        if starting:
            await asyncio.wait(starting)  # which never cancels them, even when this request is
        return [context.info for context in self._contexts.values()]

    def submit(self, context: Context, code: str, env: Mapping[str, str], sink: Sink, stop: asyncio.Event) -> None:
        task = context.submit(code, env, sink, stop)
        self._executions.add(task)
        task.add_done_callback(self._executions.discard)

    async def restart(self, context_id: str) -> None:
        await self.get(context_id).restart()

    async def delete(self, context_id: str) -> None:
        context = self.get(context_id)
        del self._contexts[context_id]
        await context.close()

    async def close(self) -> None:
        """Stop every kernel (the service is shutting down)."""
        for task in self._defaults.values():
            task.cancel()
        contexts, self._contexts = list(self._contexts.values()), {}
        await asyncio.gather(*(context.close() for context in contexts), return_exceptions=True)


def _directory(path: str) -> str:
    """`path` when it is a directory the service's user (the kernels' user) may enter; a few syscalls,
    cheap enough for the event loop. Checked here so that a bad cwd is the client's 400, not a kernel's 500."""
    if not os.path.isdir(path):
        raise BadRequest(f"cwd {path!r} is not a directory")
    if not os.access(path, os.R_OK | os.X_OK):
        user = _user_name()
        raise BadRequest(f"cwd {path!r} is not a directory the user {user!r} may enter (code runs as {user!r})")
    return path


def _user_name() -> str:
    try:
        return pwd.getpwuid(os.getuid()).pw_name
    except KeyError:
        return f"uid {os.getuid()}"


def _log_failure(task: asyncio.Task[Context]) -> None:
    if not task.cancelled() and task.exception() is not None:
        logger.warning("cannot create a default context: %s", task.exception())
