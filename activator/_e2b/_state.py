"""Where the control plane finds its collaborators: on `app.state`, set by the app's lifespan."""

from __future__ import annotations

from typing import Annotated, Any

from litestar import Request
from litestar.datastructures import State
from litestar.di import NamedDependency
from litestar.params import PathParameter

from activator._activator import Activator
from activator._keys import ApiKeys
from activator._records import MAX_SANDBOX_ID_LENGTH

__all__ = [
    "ACTIVATOR",
    "API_KEYS",
    "ActivatorDep",
    "OwnerDep",
    "SandboxIdPath",
    "activator_from",
    "api_keys_from",
    "owner_from",
]

ACTIVATOR = "activator"  # app.state key of the `Activator`
API_KEYS = "api_keys"  # app.state key of the `ApiKeys`

ActivatorDep = NamedDependency[Activator]  # handler parameter `activator`, provided by `activator_from`
OwnerDep = NamedDependency[str]  # handler parameter `owner`, provided by `owner_from`
# Handler parameter `sandbox_id`, the `{sandbox_id}` of the path: anything but an id's shape is a 400.
SandboxIdPath = Annotated[str, PathParameter(max_length=MAX_SANDBOX_ID_LENGTH, pattern="^[a-z0-9]+$")]


def activator_from(state: State) -> Activator:
    """The `Activator` (a dependency: handlers take `activator: Activator`)."""
    activator: Activator = state[ACTIVATOR]
    return activator


def api_keys_from(state: State) -> ApiKeys:
    """The `ApiKeys` the auth middleware verifies against."""
    keys: ApiKeys = state[API_KEYS]
    return keys


def owner_from(request: Request[str, None, Any]) -> str:
    """The id of the API key that authenticated the request (a dependency: handlers take `owner: str`)."""
    return request.user
