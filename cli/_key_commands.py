"""`agent-sandbox keys create|list|update|revoke`: manage API keys and their limits in the data directory's store.

A running server sees each change at its next check: a revoked key is refused within a second, new limits admit
the key's next create.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from pathlib import Path

import msgspec

from activator import ApiKey, ApiKeys, KeyLimits, SqliteStore

__all__ = ["LIMIT_FLAGS", "key_limit", "run_key_command"]

# flag -> the `KeyLimits` field it sets
LIMIT_FLAGS = {"--max-sandboxes": "max_sandboxes", "--max-memory-mb": "max_memory_mb", "--max-vcpus": "max_vcpus"}


def key_limit(text: str) -> int | None:
    """A limit as typed: a count, `none` or 0 for unlimited, `default` for the server's (None)."""
    if text == "default":
        return None
    if text == "none":
        return 0
    if not text.isdigit():
        raise argparse.ArgumentTypeError(f"expected a number, 'none' (unlimited) or 'default', not {text!r}")
    return int(text)


def _limits_given(args: argparse.Namespace, current: KeyLimits) -> KeyLimits:
    """`current` with the limits given on the command line (flags left out keep their value)."""
    given = {field: getattr(args, field) for field in LIMIT_FLAGS.values() if hasattr(args, field)}
    return msgspec.structs.replace(current, **given)


def _describe(key: ApiKey) -> str:
    limits = key.limits
    shown = [
        f"{flag.removeprefix('--')} {'default' if value is None else value or 'none'}"
        for flag, value in zip(LIMIT_FLAGS, (limits.max_sandboxes, limits.max_memory_mb, limits.max_vcpus), strict=True)
    ]
    revoked = f"\trevoked {key.revoked_at:.0f}" if key.revoked_at is not None else ""
    return f"{key.id}\t{key.name or '-'}\tcreated {key.created_at:.0f}\t{', '.join(shown)}{revoked}"


async def _run(command: str, keys: ApiKeys, args: argparse.Namespace) -> None:
    match command:
        case "create":
            key, raw = await keys.create(args.name, _limits_given(args, KeyLimits()))
            print(f"{raw}\n(id {key.id}; this is the only time the key is shown)")
        case "list":
            for key in await keys.list_keys():
                print(_describe(key))
        case "update":
            current = await keys.get(args.key_id)
            updated = current and await keys.update(args.key_id, _limits_given(args, current.limits))
            if not updated:
                sys.exit(f"agent-sandbox: no key with id {args.key_id}")
            print(_describe(updated))
        case "revoke":
            if not await keys.revoke(args.key_id):
                sys.exit(f"agent-sandbox: no unrevoked key with id {args.key_id}")
            print(f"revoked {args.key_id}: refused from now on; its sandboxes are killed once the server's "
                  "--revoked-key-grace has passed")  # fmt: skip


async def _open_and_run(command: str, data_dir: Path, args: argparse.Namespace) -> None:
    store = await SqliteStore.open(data_dir / "state.db")
    try:
        await _run(command, ApiKeys(store), args)
    finally:
        await store.close()


def run_key_command(args: argparse.Namespace) -> None:
    data_dir = Path(args.data_dir)
    if not data_dir.is_dir():
        sys.exit(f"agent-sandbox: no data directory at {data_dir} (start the server once, or pass --data-dir)")
    asyncio.run(_open_and_run(args.keys_command, data_dir, args))
