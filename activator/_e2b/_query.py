"""Decoding of E2B's listing query parameters (e2b-protocol.md §2.5)."""

from __future__ import annotations

from urllib.parse import unquote

from activator._e2b._convert import WIRE_STATES
from activator._errors import InvalidRequest
from activator._records import SandboxState

__all__ = ["decode_metadata_filter", "decode_states"]


def decode_metadata_filter(raw: str | None) -> dict[str, str]:
    """The `metadata` filter, already query-decoded once by the framework, as a dict.

    The SDK percent-encodes each key and value, joins them as `k=v&k2=v2`, and percent-encodes that string
    again as the query value. Like the reference server: unescape the whole string once more, split on `&`
    and `=` (exactly one `=` per pair), and unescape each key and value.
    """
    if not raw:
        return {}
    pairs = [pair.split("=") for pair in unquote(raw).split("&") if pair]
    if any(len(pair) != 2 for pair in pairs):
        raise InvalidRequest(f"invalid metadata filter {raw!r}: expected key=value pairs joined by '&'")
    return {unquote(key): unquote(value) for key, value in pairs}


def decode_states(raw: str | None) -> frozenset[SandboxState]:
    """The `state` filter (`running,paused`) as our states; every listed state when it is absent."""
    names = raw.split(",") if raw else list(WIRE_STATES)
    unknown = [name for name in names if name not in WIRE_STATES]
    if unknown:
        raise InvalidRequest(f"invalid state {', '.join(unknown)}: expected {' or '.join(WIRE_STATES)}")
    return frozenset().union(*(states for name, states in WIRE_STATES.items() if name in names))
