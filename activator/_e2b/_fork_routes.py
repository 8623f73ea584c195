"""E2B's fork (e2b-features.md §3): `POST /sandboxes/{id}/fork {timeout?, count?}`, answered 201 with one entry
per fork, the sandbox as create answers it or the error that fork met (`Activator.fork`); an error of the request
as a whole (no such sandbox, a paused one, a runtime that cannot fork) is the request's answer instead."""

from __future__ import annotations

from litestar import post
from litestar.handlers import HTTPRouteHandler
from litestar.params import JSONBody

from activator._e2b import _convert, _wire
from activator._e2b._openapi import keyed_errors
from activator._e2b._state import ActivatorDep, OwnerDep, SandboxIdPath
from activator._errors import ActivatorError
from activator._records import SandboxRecord

__all__ = ["FORK_ROUTES"]


@post("/sandboxes/{sandbox_id:str}/fork", status_code=201, responses=keyed_errors(400, 404, 409, 413, 501))
async def fork(
    sandbox_id: SandboxIdPath,
    activator: ActivatorDep,
    owner: OwnerDep,
    data: JSONBody[_wire.ForkRequest | None] = None,
) -> list[_wire.ForkResult]:
    """`count` forks of the running sandbox with its memory (the source is frozen while its image is taken and runs
    on); 501 where the runtime cannot fork, 409 while the sandbox is paused."""
    options = data or _wire.ForkRequest()
    forks = await activator.fork(
        owner, sandbox_id, count=1 if options.count is None else options.count, lifetime=options.timeout
    )
    return [_result(outcome) for outcome in forks]


def _result(outcome: SandboxRecord | ActivatorError) -> _wire.ForkResult:
    if isinstance(outcome, ActivatorError):
        error = _wire.ErrorBody(code=outcome.status_code, message=str(outcome), error_code=outcome.error_code)
        return _wire.ForkResult(error=error)
    return _wire.ForkResult(sandbox=_convert.sandbox(outcome))


FORK_ROUTES: list[HTTPRouteHandler] = [fork]
