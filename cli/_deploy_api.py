"""The E2B control-plane calls a deploy makes: find, create, connect, list and delete deployment sandboxes.

A deployment is a sandbox whose metadata names it (`ai-deploy: <name>`, `ai-deploy-port: <port>`), created
with the longest timeout and `lifecycle: {onTimeout: pause, autoResume: true}`: idle it is frozen, then
snapshotted; at its timeout it is paused instead of killed; any visitor wakes it, and the wake gives it a
full timeout again. So its URL keeps working until the deployment is deleted.
"""

from __future__ import annotations

from urllib.parse import quote

import httpx
import msgspec

from cli._deploy_errors import DeployError

__all__ = ["NAME_KEY", "PORT_KEY", "Connected", "ControlPlane", "Deployment"]

NAME_KEY = "ai-deploy"
PORT_KEY = "ai-deploy-port"
TIMEOUT = 86_400  # the longest the API allows; with autoResume every wake starts it again


class Deployment(msgspec.Struct, frozen=True, kw_only=True):
    """A deployment as listed: its name, sandbox, port and E2B state (`running` or `paused`)."""

    name: str
    sandbox_id: str
    port: int
    state: str
    template: str


class Connected(msgspec.Struct, frozen=True, kw_only=True):
    """A running deployment sandbox and what reaching it needs (the answer of create and connect)."""

    sandbox_id: str
    domain: str | None
    access_token: str | None


class _Listed(msgspec.Struct, rename="camel"):
    sandbox_id: str = msgspec.field(name="sandboxID")
    template_id: str = msgspec.field(name="templateID")
    state: str = "running"
    metadata: dict[str, str] = {}


class _Sandbox(msgspec.Struct, rename="camel"):
    sandbox_id: str = msgspec.field(name="sandboxID")
    domain: str | None = None
    envd_access_token: str | None = None


class ControlPlane:
    """The E2B REST API of one server, with one API key (set on `client`)."""

    def __init__(self, client: httpx.Client) -> None:
        self._client = client

    def find(self, name: str) -> Deployment | None:
        """The deployment called `name`, running or paused, or None."""
        metadata = f"{quote(NAME_KEY)}={quote(name)}"
        found = self._listed({"metadata": metadata})
        return found[0] if found else None

    def deployments(self) -> list[Deployment]:
        """Every deployment of this key, newest first."""
        return self._listed({})

    def _listed(self, params: dict[str, str]) -> list[Deployment]:
        deployments: list[Deployment] = []
        token: str | None = None
        while True:
            page = params | ({"nextToken": token} if token else {})
            response = self._call("GET", "/v2/sandboxes", params=page)
            for item in msgspec.json.decode(response.content, type=list[_Listed]):
                if NAME_KEY in item.metadata:
                    deployments.append(_deployment(item))
            token = response.headers.get("x-next-token")
            if not token:
                return deployments

    def create(self, name: str, template: str, port: int) -> Connected:
        """A new deployment sandbox, running."""
        body = {
            "templateID": template, "timeout": TIMEOUT, "metadata": {NAME_KEY: name, PORT_KEY: str(port)},
            "lifecycle": {"onTimeout": "pause", "autoResume": True},
        }  # fmt: skip
        return _connected(self._call("POST", "/v2/sandboxes", json=body))

    def connect(self, sandbox_id: str) -> Connected:
        """Wake the deployment's sandbox if it sleeps, and give it the full timeout again."""
        return _connected(self._call("POST", f"/sandboxes/{sandbox_id}/connect", json={"timeout": TIMEOUT}))

    def domain(self, sandbox_id: str) -> str | None:
        """The sandbox's domain, as `GET /sandboxes/{id}` reports it (null: the client's own)."""
        return msgspec.json.decode(self._call("GET", f"/sandboxes/{sandbox_id}").content, type=_Sandbox).domain

    def delete(self, sandbox_id: str) -> None:
        self._call("DELETE", f"/sandboxes/{sandbox_id}")

    def _call(
        self, method: str, path: str, *, params: dict[str, str] | None = None, json: object = None
    ) -> httpx.Response:
        response = self._client.request(method, path, params=params, json=json)
        if response.is_success:
            return response
        message = error_message(response)
        if response.status_code in (401, 403):
            raise DeployError(f"{self._client.base_url} refused the API key ({response.status_code}): {message}")
        raise DeployError(f"{method} {path} failed: {response.status_code} {message}")


def _deployment(item: _Listed) -> Deployment:
    port = item.metadata.get(PORT_KEY, "")
    return Deployment(
        name=item.metadata[NAME_KEY], sandbox_id=item.sandbox_id, port=int(port) if port.isdigit() else 0,
        state=item.state, template=item.template_id,
    )  # fmt: skip


def _connected(response: httpx.Response) -> Connected:
    sandbox = msgspec.json.decode(response.content, type=_Sandbox)
    return Connected(sandbox_id=sandbox.sandbox_id, domain=sandbox.domain, access_token=sandbox.envd_access_token)


def error_message(response: httpx.Response) -> str:
    """The `message` of an E2B-shaped error answer (else its text), at most 300 characters."""
    try:
        message = msgspec.json.decode(response.content).get("message")
    except (msgspec.DecodeError, AttributeError):
        message = None
    return str(message or response.text)[:300]
