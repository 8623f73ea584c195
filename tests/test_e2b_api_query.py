"""Decoding of E2B's listing query: the double-encoded metadata filter and the state list."""

from __future__ import annotations

from urllib.parse import quote, urlencode

import pytest

from activator import InvalidRequest, SandboxState
from activator._e2b._query import decode_metadata_filter, decode_states


def sdk_encoded(metadata: dict[str, str]) -> str:
    """What the query value looks like after the framework's one decoding (the SDK's paginator encoding)."""
    return urlencode({quote(k): quote(v) for k, v in metadata.items()})


def test_the_traced_filter_decodes() -> None:
    assert decode_metadata_filter("owner=alice&k%2520y=v%2526w") == {"owner": "alice", "k y": "v&w"}


@pytest.mark.parametrize("metadata", [{"a": "b"}, {"k=1": "v&2", "ünï": "çødé", "sp ace": "100%"}, {"x": ""}])
def test_whatever_the_sdk_encodes_decodes_back(metadata: dict[str, str]) -> None:
    assert decode_metadata_filter(sdk_encoded(metadata)) == metadata


@pytest.mark.parametrize("raw", [None, ""])
def test_no_filter_is_an_empty_one(raw: str | None) -> None:
    assert decode_metadata_filter(raw) == {}


@pytest.mark.parametrize("raw", ["owner", "a=b=c", "a=b&c"])
def test_pairs_need_exactly_one_equals_sign(raw: str) -> None:
    with pytest.raises(InvalidRequest):
        decode_metadata_filter(raw)


def test_states_default_to_every_listed_state() -> None:
    assert decode_states(None) == {SandboxState.RUNNING, SandboxState.PAUSED}
    assert decode_states("paused") == {SandboxState.PAUSED}
    assert decode_states("running,paused") == {SandboxState.RUNNING, SandboxState.PAUSED}


def test_unknown_states_are_refused() -> None:
    with pytest.raises(InvalidRequest, match="asleep"):
        decode_states("running,asleep")
