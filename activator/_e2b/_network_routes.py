"""E2B's `update_network` (PUT /sandboxes/{id}/network): replace a sandbox's egress rules while it lives.

Create takes the same options in its body (`_convert.create_request`); both are checked by `activator._network`.
"""

from __future__ import annotations

from litestar import put
from litestar.handlers import HTTPRouteHandler
from litestar.params import JSONBody

from activator._e2b import _convert, _wire
from activator._e2b._openapi import keyed_errors
from activator._e2b._state import ActivatorDep, OwnerDep, SandboxIdPath

__all__ = ["NETWORK_ROUTES"]


@put("/sandboxes/{sandbox_id:str}/network", status_code=204, responses=keyed_errors(400, 404, 413))
async def update_network(
    sandbox_id: SandboxIdPath, data: JSONBody[_wire.NetworkUpdate], activator: ActivatorDep, owner: OwnerDep
) -> None:
    """Replace the egress rules (what the body omits is cleared); 404 when the sandbox is unknown or killed."""
    egress = _convert.network_update(data)
    await activator.update_network(owner, sandbox_id, egress, allow_internet_access=data.allow_internet_access)


NETWORK_ROUTES: list[HTTPRouteHandler] = [update_network]
