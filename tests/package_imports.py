"""Every import of the product's packages, read from their source with `ast`, and the two rules they must keep.

Read from the source rather than from `sys.modules` so that an import nobody runs in a test (inside a function,
under `if TYPE_CHECKING:`, in a module no test imports) is seen too. `tests/test_package_boundaries.py` holds the
rules to the tree; `tests/test_package_exports.py` checks that every name one package takes from another's root
is in that root's `__all__`.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import NamedTuple

__all__ = ["MAY_IMPORT", "REPOSITORY", "UNCHECKED", "Import", "Violation", "imports", "violations"]

REPOSITORY = Path(__file__).resolve().parent.parent

# Each package and the packages it may import: `cli → gateway → activator → pool`, each may use any below it;
# `executor` runs inside the sandbox and imports none of them (its public wire modules are for all to use);
# `kube_dev` is a test tool over the Kubernetes client.
MAY_IMPORT: Mapping[str, frozenset[str]] = {
    "cli": frozenset({"gateway", "activator", "pool", "executor"}),
    "gateway": frozenset({"activator", "pool", "executor"}),
    "activator": frozenset({"pool", "executor"}),
    "pool": frozenset({"executor"}),
    "executor": frozenset(),
    "kube_dev": frozenset({"pool"}),
}
# They may import anything, and nothing above may import them.
UNCHECKED = frozenset({"tests", "loadtests"})


class Import(NamedTuple):
    """One import in a module: `pool._kube` and `KubeApi` for `from pool._kube import KubeApi`."""

    path: Path
    line: int
    module: str
    name: str | None  # None for `import module`

    @property
    def target(self) -> str:
        return self.module if self.name is None else f"{self.module}.{self.name}"

    @property
    def package(self) -> str:
        return self.module.partition(".")[0]

    @property
    def private_module(self) -> str | None:
        """The private module or name it goes through below its package's root (`pool._kube`), if any."""
        parts = self.target.split(".")
        private = next((at for at, part in enumerate(parts) if at and part.startswith("_")), None)
        return None if private is None else ".".join(parts[: private + 1])


class Violation(NamedTuple):
    path: Path
    line: int
    why: str

    def __str__(self) -> str:
        return f"{self.path}:{self.line}: {self.why}"


def imports(root: Path, package: str) -> Iterator[Import]:
    """Every absolute import in `root/package`'s modules, wherever in a module it is written.

    Relative imports are left out: Python refuses one that would climb out of its top-level package, so they never
    cross a boundary.
    """
    for path in sorted((root / package).rglob("*.py")):
        relative = path.relative_to(root)
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                yield from (Import(relative, node.lineno, alias.name, None) for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                yield from (Import(relative, node.lineno, node.module, alias.name) for alias in node.names)


def violations(root: Path) -> list[Violation]:
    """Each import of another package's private module, and each import against the direction, in `root`."""
    found: dict[Violation, None] = {}  # one line importing several names is one violation
    project = MAY_IMPORT.keys() | UNCHECKED
    for package, allowed in MAY_IMPORT.items():
        for imported in imports(root, package):
            if imported.package not in project or imported.package == package:
                continue  # a library, or the package's own modules (its root gathers its public names from them)
            if imported.package not in allowed:
                found[Violation(imported.path, imported.line, f"{package} must not import {imported.package}")] = None
            elif private := imported.private_module:
                why = f"{private} is private to {imported.package}: import from its root"
                found[Violation(imported.path, imported.line, why)] = None
    return list(found)
