"""Where the control plane finds its collaborators: on `app.state`, set by the app's lifespan."""

from __future__ import annotations

from typing import Any

from litestar import Request
from litestar.datastructures import State
from litestar.di import NamedDependency
from litestar.params import FromPath

from activator._activator import Activator
from activator._keys import ApiKeys

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
SandboxIdPath = FromPath[str]  # handler parameter `sandbox_id`, the `{sandbox_id}` of the path


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
