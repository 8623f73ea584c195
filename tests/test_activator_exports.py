"""The package's public names are listed once, in `activator.__all__`."""

from __future__ import annotations

import activator


def test_every_public_name_is_exported() -> None:
    public = sorted(name for name in vars(activator) if not name.startswith("_"))
    assert sorted(activator.__all__) == public
