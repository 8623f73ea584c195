"""Print the packages of a template's layers of the given kinds, one per line; for `run`, their scripts.

The sandbox Dockerfiles install (or run) what this prints, so an image is built from the same template file as
the local runtime's layers (templates/*.toml) and the two cannot drift apart.

    python3 template-packages.py templates/base.toml debootstrap,apt
    python3 template-packages.py templates/chromium.toml run | bash -e
"""

from __future__ import annotations

import sys
import tomllib


def main(path: str, kinds: str) -> None:
    with open(path, "rb") as f:
        template = tomllib.load(f)
    wanted = set(kinds.split(","))
    for layer in template.get("layers", []):
        if layer["kind"] in wanted and layer["kind"] == "run":
            print(layer["script"])
        elif layer["kind"] in wanted:
            for package in layer.get("packages", []):
                print(package)


if __name__ == "__main__":
    main(*sys.argv[1:3])
