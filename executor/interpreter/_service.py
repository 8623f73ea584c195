"""Routing of port 49999 (e2b-protocol.md §4.1); errors are plain text, as the reference server sends them.

    GET  /health                   200 "OK"
    POST /execute                  200 NDJSON stream (`_execute`)
    POST /contexts                 200 {"id", "language", "cwd"}
    GET  /contexts                 200 [{"id", "language", "cwd"}, ...]
    POST /contexts/{id}/restart    204
    DELETE /contexts/{id}          204
    anything else                  404 / 405

No request is authenticated here (neither does the reference): the gateway decides who reaches the port.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TypeVar

import msgspec

from executor._errors import PayloadTooLarge
from executor._exchange import Request, Response
from executor.interpreter._backend import BadRequest, InterpreterError, Unauthorized
from executor.interpreter._contexts import Context, Contexts
from executor.interpreter._envcode import valid_env_name
from executor.interpreter._envd import EnvdClient
from executor.interpreter._execute import stream_execution
from executor.interpreter._wire import ContextInfo, CreateContext, ExecuteRequest

__all__ = ("Service", "ServiceSettings")

JSON = "application/json"
TEXT = "text/plain; charset=utf-8"
MAX_BODY_BYTES = 16 * 1024 * 1024

_execute_request = msgspec.json.Decoder(ExecuteRequest)
_create_context = msgspec.json.Decoder(CreateContext)
_encoder = msgspec.json.Encoder()

_T = TypeVar("_T")

Route = Callable[[Request, Response], Awaitable[None]]


@dataclass(frozen=True)
class ServiceSettings:
    """Decided once by the entry point."""

    execution_limit: float | None = 3600.0  # seconds an execution may run; None: as long as the client waits


class Service:
    """The interpreter's request handler."""

    def __init__(self, contexts: Contexts, envd: EnvdClient, settings: ServiceSettings) -> None:
        self._contexts = contexts
        self._envd = envd
        self._settings = settings
        self._routes: dict[str, dict[str, Route]] = {
            "/health": {"GET": self._health, "HEAD": self._health},
            "/execute": {"POST": self._execute},
            "/contexts": {"GET": self._list, "POST": self._create},
        }

    async def handle(self, request: Request, response: Response) -> None:
        try:
            await self._dispatch(request, response)
        except InterpreterError as exc:
            if not response.started:
                await response.send(exc.status, exc.message.encode(), TEXT)

    async def _dispatch(self, request: Request, response: Response) -> None:
        methods = self._routes.get(request.path)
        if methods is None:
            methods = self._context_routes(request.path)
        if methods is None:
            await response.send(404, f"Not found: {request.path}".encode(), TEXT)
        elif request.method not in methods:
            await response.send(405, f"Method {request.method} not allowed on {request.path}".encode(), TEXT)
        else:
            await methods[request.method](request, response)

    def _context_routes(self, path: str) -> dict[str, Route] | None:
        parts = path.strip("/").split("/")
        if len(parts) == 2 and parts[0] == "contexts":
            return {"DELETE": lambda request, response: self._delete(parts[1], response)}
        if len(parts) == 3 and parts[0] == "contexts" and parts[2] == "restart":
            return {"POST": lambda request, response: self._restart(parts[1], response)}
        return None

    async def _health(self, request: Request, response: Response) -> None:
        await response.send(200, b'"OK"', JSON)

    async def _execute(self, request: Request, response: Response) -> None:
        body = await _read_json(request, _execute_request)
        if body.context_id and body.language:
            raise BadRequest("Only one of context_id or language can be provided")
        env = await self._envd.envs(request.headers.get("x-access-token"))
        if env is None:
            raise Unauthorized("the sandbox's access token is required (X-Access-Token)")
        env.update(body.env_vars or {})
        bad = sorted(name for name in env if not valid_env_name(name))
        if bad:
            raise BadRequest(f"Invalid environment variable names: {', '.join(bad)}")
        context = await self._context(body)
        await stream_execution(self._contexts, context, body.code, env, response, self._settings.execution_limit)

    async def _context(self, body: ExecuteRequest) -> Context:
        if body.context_id:
            return self._contexts.get(body.context_id)
        return await self._contexts.default(body.language)

    async def _create(self, request: Request, response: Response) -> None:
        body = await _read_json(request, _create_context)
        context = await self._contexts.create(body.language, body.cwd)
        await response.send(200, _encoder.encode(context.info), JSON)

    async def _list(self, request: Request, response: Response) -> None:
        infos: list[ContextInfo] = await self._contexts.infos()
        await response.send(200, _encoder.encode(infos), JSON)

    async def _restart(self, context_id: str, response: Response) -> None:
        await self._contexts.restart(context_id)
        await response.send(204)

    async def _delete(self, context_id: str, response: Response) -> None:
        await self._contexts.delete(context_id)
        await response.send(204)


async def _read_json(request: Request, decoder: msgspec.json.Decoder[_T]) -> _T:
    try:
        raw = await request.body.read(MAX_BODY_BYTES)
    except PayloadTooLarge as exc:
        raise BadRequest(exc.message) from exc
    try:
        return decoder.decode(raw or b"{}")
    except msgspec.DecodeError as exc:
        raise BadRequest(f"Invalid request body: {exc}") from exc
