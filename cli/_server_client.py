"""How the CLI's client commands (`deploy`, `templates list|delete`) find a running server and their API key.

`--url` (else `E2B_API_URL`, else http://127.0.0.1:3000) with `--key` (else `E2B_API_KEY`, else the local
server's `<data-dir>/api-key`). These commands need no root.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Mapping
from pathlib import Path

from gateway import ServeSettings

__all__ = ["DEFAULT_URL", "NoApiKey", "add_server_arguments", "server_and_key"]

DEFAULT_URL = "http://127.0.0.1:3000"


class NoApiKey(Exception):
    """No key was given and the local server's key file cannot be read."""


def add_server_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--url", help=f"the server (default: E2B_API_URL, else {DEFAULT_URL})")
    parser.add_argument("--key", help="API key (default: E2B_API_KEY, else <data-dir>/api-key)")
    parser.add_argument(
        "--data-dir", type=Path, default=Path(os.environ.get("AGENT_SANDBOX_DATA_DIR") or ServeSettings().data_dir),
        help="where a local server keeps its api-key file (default %(default)s)",
    )  # fmt: skip


def server_and_key(args: argparse.Namespace, environ: Mapping[str, str] = os.environ) -> tuple[str, str]:
    """The server's URL and the API key to call it with; NoApiKey when there is none."""
    url = args.url or environ.get("E2B_API_URL") or DEFAULT_URL
    if args.key or environ.get("E2B_API_KEY"):
        return url, args.key or environ["E2B_API_KEY"]
    try:
        return url, (args.data_dir / "api-key").read_text().strip()
    except OSError as exc:
        raise NoApiKey(
            f"no API key: pass --key or set E2B_API_KEY (cannot read {args.data_dir / 'api-key'}: {exc.strerror})"
        ) from exc
