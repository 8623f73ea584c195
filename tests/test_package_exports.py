"""Each package lists its public names once, in its root's `__all__`, and that list covers what other code takes.

After httpx's `tests/test_exported_members.py`: a public name defined or imported in a root but left out of
`__all__` fails, and so does a name that another package (or another part of the same package) imports from a
root without its being listed there. `tests/package_imports.py` reads those imports from the source.
"""

from __future__ import annotations

import ast
import importlib

import pytest

from tests.package_imports import MAY_IMPORT, REPOSITORY, imports

# Every public package of the product, subpackages included (`gateway.ui`, `executor.interpreter`).
PACKAGES = sorted(
    ".".join(init.parent.relative_to(REPOSITORY).parts)
    for package in MAY_IMPORT
    for init in (REPOSITORY / package).rglob("__init__.py")
    if not any(part.startswith("_") for part in init.parent.relative_to(REPOSITORY).parts)
)


def _bound_in_root(name: str) -> set[str]:
    """The public names a package's root binds: what it defines, assigns or imports from the project.

    Read from the source, so that names a root loads on first use (PEP 562, under `if TYPE_CHECKING:`) count, and
    `from typing import TYPE_CHECKING` and the like do not.
    """
    statements = list(ast.parse((REPOSITORY / name.replace(".", "/") / "__init__.py").read_text()).body)
    bound = set()
    while statements:
        match statement := statements.pop():
            case ast.If(body=body, orelse=orelse):
                statements += body + orelse
            case ast.ImportFrom(module=str(module), level=0) if module.partition(".")[0] in MAY_IMPORT:
                bound |= {alias.asname or alias.name for alias in statement.names}
            case ast.FunctionDef(name=defined) | ast.AsyncFunctionDef(name=defined) | ast.ClassDef(name=defined):
                bound.add(defined)
            case ast.Assign(targets=targets):
                bound |= {target.id for target in targets if isinstance(target, ast.Name)}
            case ast.AnnAssign(target=ast.Name(id=assigned)):
                bound.add(assigned)
    return {member for member in bound if not member.startswith("_")}


@pytest.mark.parametrize("name", PACKAGES)
def test_every_public_name_of_a_root_is_in_its_all(name: str) -> None:
    assert _bound_in_root(name) - set(importlib.import_module(name).__all__) == set()


@pytest.mark.parametrize("name", PACKAGES)
def test_every_name_in_a_roots_all_is_there(name: str) -> None:
    package = importlib.import_module(name)
    assert [member for member in package.__all__ if not hasattr(package, member)] == []


@pytest.mark.parametrize("name", PACKAGES)
def test_what_other_modules_import_from_a_root_is_in_its_all(name: str) -> None:
    exported = set(importlib.import_module(name).__all__)
    taken = {
        f"{imported.path}:{imported.line}: {imported.name}"
        for importer in MAY_IMPORT
        for imported in imports(REPOSITORY, importer)
        if imported.module == name and imported.name is not None and imported.name not in exported
        and not imported.path.is_relative_to(name.replace(".", "/"))  # a root's own modules build it
    }  # fmt: skip
    assert sorted(taken) == []
