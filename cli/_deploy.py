"""`agent-sandbox deploy`: publish a directory's static site or Node / Python app from a sandbox at a public URL.

    agent-sandbox deploy DIR [--name NAME] [--port P]   create, or update in place (same sandbox, same URL)
    agent-sandbox deploy --list                          the deployments, with state and URL
    agent-sandbox deploy --delete NAME                   delete one

It is a client of a running server (`cli._server_client`: `--url`, `--key`). Unlike most commands it needs no root.
Every failure is one line on stderr and exit status 1; the URL is the only line on stdout.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
from collections.abc import Mapping
from pathlib import Path

import httpx

from cli._deploy_errors import DeployError
from cli._deploy_steps import Deployer
from cli._server_client import NoApiKey, add_server_arguments, server_and_key

__all__ = ["DEPLOY_HELP", "add_deploy_arguments", "run_deploy"]

DEPLOY_HELP = "publish a static site or a Node / Python app from a sandbox at a URL that sleeps when idle"
_NAME = re.compile(r"[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?")
_TIMEOUT = httpx.Timeout(30.0, read=120.0)  # a create, or a wake from a snapshot, takes well under that


def add_deploy_arguments(parser: argparse.ArgumentParser) -> None:
    """The `deploy` subcommand's arguments (its parser is made by the CLI)."""
    parser.add_argument("directory", nargs="?", type=Path, help="the site or app to deploy")
    parser.add_argument("--name", help="the deployment's name (default: the directory's name)")
    parser.add_argument("--port", type=int, help="the port the app listens on, given to it as PORT (default 8080)")
    add_server_arguments(parser)
    action = parser.add_mutually_exclusive_group()
    action.add_argument("--list", action="store_true", help="list the deployments")
    action.add_argument("--delete", metavar="NAME", help="delete the deployment NAME")


def run_deploy(args: argparse.Namespace, environ: Mapping[str, str] = os.environ) -> int:
    """Carry out `agent-sandbox deploy ARGS`; the exit status."""
    try:
        url, key = server_and_key(args, environ)
    except NoApiKey as exc:
        return _fail(str(exc))
    try:
        with (
            httpx.Client(base_url=url, headers={"X-API-Key": key}, timeout=_TIMEOUT) as api,
            httpx.Client(base_url=url, timeout=_TIMEOUT) as sandboxes,
        ):
            _dispatch(args, Deployer(api, sandboxes))
    except DeployError as exc:
        return _fail(str(exc))
    except httpx.TimeoutException:
        return _fail(f"{url} did not answer in time")
    except httpx.HTTPError as exc:
        return _fail(f"cannot reach agent-sandbox at {url}: {exc or type(exc).__name__}")
    return 0


def _dispatch(args: argparse.Namespace, deployer: Deployer) -> None:
    if args.list:
        for deployment, public in deployer.deployments():
            print(f"{deployment.name}\t{deployment.state}\t{public}\t{deployment.sandbox_id}")
    elif args.delete:
        gone = deployer.delete(args.delete)
        print(f"deleted {gone.name} (sandbox {gone.sandbox_id})")
    elif args.directory is not None:
        name = args.name or _name_of(args.directory)
        if not _NAME.fullmatch(name):
            raise DeployError(f"invalid name {name!r}: use 1-63 lowercase letters, digits and '-'")
        print(deployer.deploy(args.directory, name, args.port))
    else:
        raise DeployError("give a DIR to deploy, --list or --delete NAME")


def _name_of(directory: Path) -> str:
    """A name from the directory's own name: lowercased, other characters turned into '-'."""
    return re.sub(r"[^a-z0-9]+", "-", directory.resolve().name.lower()).strip("-")[:63] or "site"


def _fail(message: str) -> int:
    print(f"agent-sandbox deploy: {message}", file=sys.stderr)
    return 1
