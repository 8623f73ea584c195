"""`agent-sandbox deploy`: publish a directory's static site or Node / Python app from a sandbox at a public URL.

    agent-sandbox deploy DIR [--name NAME] [--port P]   create, or update in place (same sandbox, same URL)
    agent-sandbox deploy --list                          the deployments, with state and URL
    agent-sandbox deploy --delete NAME                   delete one

It is a client of a running server: `--url` (else `E2B_API_URL`, else http://127.0.0.1:3000) with `--key` (else
`E2B_API_KEY`, else the server's `<data-dir>/api-key`). Unlike the other commands it does not need root.
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
from gateway import ServeSettings

__all__ = ["DEPLOY_HELP", "add_deploy_arguments", "run_deploy"]

DEPLOY_HELP = "publish a static site or a Node / Python app from a sandbox at a URL that sleeps when idle"
DEFAULT_URL = "http://127.0.0.1:3000"
_NAME = re.compile(r"[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?")
_TIMEOUT = httpx.Timeout(30.0, read=120.0)  # a create, or a wake from a snapshot, takes well under that


def add_deploy_arguments(parser: argparse.ArgumentParser) -> None:
    """The `deploy` subcommand's arguments (its parser is made by the CLI)."""
    parser.add_argument("directory", nargs="?", type=Path, help="the site or app to deploy")
    parser.add_argument("--name", help="the deployment's name (default: the directory's name)")
    parser.add_argument("--port", type=int, help="the port the app listens on, given to it as PORT (default 8080)")
    parser.add_argument("--url", help=f"the server (default: E2B_API_URL, else {DEFAULT_URL})")
    parser.add_argument("--key", help="API key (default: E2B_API_KEY, else <data-dir>/api-key)")
    parser.add_argument(
        "--data-dir", type=Path, default=Path(os.environ.get("AGENT_SANDBOX_DATA_DIR") or ServeSettings().data_dir),
        help="where a local server keeps its api-key file (default %(default)s)",
    )  # fmt: skip
    action = parser.add_mutually_exclusive_group()
    action.add_argument("--list", action="store_true", help="list the deployments")
    action.add_argument("--delete", metavar="NAME", help="delete the deployment NAME")


def run_deploy(args: argparse.Namespace, environ: Mapping[str, str] = os.environ) -> int:
    """Carry out `agent-sandbox deploy ARGS`; the exit status."""
    url = args.url or environ.get("E2B_API_URL") or DEFAULT_URL
    try:
        key = args.key or environ.get("E2B_API_KEY") or _key_file(args.data_dir)
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


def _key_file(data_dir: Path) -> str:
    try:
        return (data_dir / "api-key").read_text().strip()
    except OSError as exc:
        raise DeployError(
            f"no API key: pass --key or set E2B_API_KEY (cannot read {data_dir / 'api-key'}: {exc.strerror})"
        ) from exc


def _fail(message: str) -> int:
    print(f"agent-sandbox deploy: {message}", file=sys.stderr)
    return 1
