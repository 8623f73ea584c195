"""`agent-sandbox keys create|list|revoke`: manage API keys in the data directory's store."""

from __future__ import annotations

import argparse
import asyncio
import sys
from pathlib import Path

from activator import ApiKeys, SqliteStore

__all__ = ["run_key_command"]


async def _run(command: str, data_dir: Path, args: argparse.Namespace) -> None:
    store = await SqliteStore.open(data_dir / "state.db")
    keys = ApiKeys(store)
    try:
        match command:
            case "create":
                key, raw = await keys.create(args.name)
                print(f"{raw}\n(id {key.id}; this is the only time the key is shown)")
            case "list":
                for key in await keys.list_keys():
                    print(f"{key.id}\t{key.name or '-'}\tcreated {key.created_at:.0f}")
            case "revoke":
                if not await keys.revoke(args.key_id):
                    sys.exit(f"agent-sandbox: no key with id {args.key_id}")
                print(f"revoked {args.key_id}")
    finally:
        await store.close()


def run_key_command(args: argparse.Namespace) -> None:
    data_dir = Path(args.data_dir)
    if not data_dir.is_dir():
        sys.exit(f"agent-sandbox: no data directory at {data_dir} (start the server once, or pass --data-dir)")
    asyncio.run(_run(args.keys_command, data_dir, args))
