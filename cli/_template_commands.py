"""`agent-sandbox templates list|delete`: a key's view of the templates of a running server (built-in ones and
the key's own, built with the E2B Template SDK), as a client of its API (`cli._server_client`)."""

from __future__ import annotations

import argparse
import sys
from urllib.parse import quote

import httpx
import msgspec

from cli._deploy_api import error_message
from cli._server_client import NoApiKey, server_and_key

__all__ = ["run_template_command"]


class _Listed(msgspec.Struct):
    template_id: str = msgspec.field(name="templateID")
    names: list[str] = []
    public: bool = True
    build_status: str = msgspec.field(default="ready", name="buildStatus")
    cpu_count: int = msgspec.field(default=0, name="cpuCount")
    memory_mb: int = msgspec.field(default=0, name="memoryMB")


def run_template_command(args: argparse.Namespace) -> int:
    """`templates list` or `templates delete NAME`; the exit status."""
    try:
        url, key = server_and_key(args)
    except NoApiKey as exc:
        return _fail(str(exc))
    try:
        with httpx.Client(base_url=url, headers={"X-API-Key": key}, timeout=30.0) as api:
            if args.templates_command == "list":
                return _list(api)
            return _delete(api, args.name)
    except httpx.HTTPError as exc:
        return _fail(f"cannot reach agent-sandbox at {url}: {exc or type(exc).__name__}")
    except msgspec.DecodeError as exc:
        return _fail(f"{url} did not answer as agent-sandbox does: {exc}")


def _list(api: httpx.Client) -> int:
    response = api.get("/templates")
    if response.status_code != 200:
        return _refused(response)
    print("NAME\tTEMPLATE ID\tSTATUS\tOWNER\tCPU\tMEMORY")
    for listed in msgspec.json.decode(response.content, type=list[_Listed]):
        owner = "built-in" if listed.public else "this key"
        name = listed.names[0] if listed.names else listed.template_id
        print(
            f"{name}\t{listed.template_id}\t{listed.build_status}\t{owner}\t{listed.cpu_count}\t{listed.memory_mb} MiB"
        )
    return 0


def _delete(api: httpx.Client, name: str) -> int:
    response = api.delete(f"/templates/{quote(name, safe='')}")
    if response.status_code != 204:
        return _refused(response)
    print(f"deleted template {name}")
    return 0


def _refused(response: httpx.Response) -> int:
    return _fail(f"{response.status_code}: {error_message(response)}")


def _fail(message: str) -> int:
    print(f"agent-sandbox templates: {message}", file=sys.stderr)
    return 1
