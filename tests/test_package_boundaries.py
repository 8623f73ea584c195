"""The packages keep their boundaries: checked on the source of every module, not on what the tests happen to import.

Two rules (`tests/package_imports.py` reads the imports and holds the direction table):

- A package takes another package's names from its root or a public module (`from pool import KubeApi`), never
  from a private module: any dotted path with a part that starts with `_` (`from pool._kube import KubeApi`,
  `import pool._envd`, `from pool import _envd`). Within a package any module may import any other, private or
  not: that is how `pool/__init__.py` gathers its public names from `pool._local._checks` and the like. The rule
  is about other packages' private modules.
- Dependencies point one way: `cli → gateway → activator → pool`, each package may import the ones below it;
  `executor` imports none of them, and all of them may use its wire (`executor.envd`); `kube_dev` (the dev
  cluster, a test tool) imports only `pool`.
  `tests` and `loadtests` may import anything and are not checked; nothing of the product may import them.

And `executor`, which runs in every sandbox image, needs no library but msgspec and httptools.
"""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path

from tests.package_imports import REPOSITORY, imports, violations


def test_no_package_imports_a_private_module_of_another_or_against_the_direction() -> None:
    found = violations(REPOSITORY)
    assert not found, "imports across the package boundaries:\n" + "\n".join(map(str, found))


def test_the_executor_needs_no_library_but_msgspec_and_httptools() -> None:
    """It runs in every sandbox image: a new dependency would change them all (its code interpreter and MCP gateway
    have venvs of their own, in their templates)."""
    libraries = {
        f"{imported.path}:{imported.line}: {imported.package}"
        for imported in imports(REPOSITORY, "executor")
        if imported.package not in {*sys.stdlib_module_names, "executor", "msgspec", "httptools"}
        and not imported.path.is_relative_to("executor/interpreter")
        and not imported.path.is_relative_to("executor/mcp_gateway")
    }  # fmt: skip
    assert sorted(libraries) == []


def _tree(root: Path, modules: dict[str, str]) -> Path:
    for name, source in modules.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(source))
    return root


def test_a_private_import_of_another_package_is_reported_wherever_it_is_written(tmp_path: Path) -> None:
    root = _tree(
        tmp_path,
        {
            "pool/__init__.py": "from pool._kube import KubeApi\n",  # its own private module: allowed
            "activator/_a.py": "from pool import KubeApi\nfrom pool._kube import KubeApi, KubeApiError\n",
            "activator/_b.py": "def f() -> None:\n    import pool._envd\n",
            "activator/_c.py": """\
                from typing import TYPE_CHECKING

                if TYPE_CHECKING:
                    from pool import _envd
                """,
        },
    )
    assert [str(found) for found in violations(root)] == [
        "activator/_a.py:2: pool._kube is private to pool: import from its root",
        "activator/_b.py:2: pool._envd is private to pool: import from its root",
        "activator/_c.py:4: pool._envd is private to pool: import from its root",
    ]


def test_an_import_against_the_direction_is_reported(tmp_path: Path) -> None:
    root = _tree(
        tmp_path,
        {
            "cli/_main.py": "from gateway import serve\n",
            "gateway/_serve.py": "from cli import main\n",
            "activator/_store.py": "from tests.polling import wait_until\n",
            "pool/_runtime.py": "import activator\nimport httpx\n",
            "executor/_app.py": "from pool import envd\n",
            "kube_dev/_agent.py": "from pool import KubeApi\nfrom activator import KubeStore\n",
        },
    )
    assert [str(found) for found in violations(root)] == [
        "gateway/_serve.py:1: gateway must not import cli",
        "activator/_store.py:1: activator must not import tests",
        "pool/_runtime.py:1: pool must not import activator",
        "executor/_app.py:1: executor must not import pool",
        "kube_dev/_agent.py:2: kube_dev must not import activator",
    ]
