"""Template layers on disk: built once into the image cache, then shared read-only by every sandbox.

A layer is a directory. The bottom one is a Debian root made by debootstrap, or a container image pulled from a
registry and unpacked (`OciLayer`, `_oci`); each layer above it is the
overlayfs upper directory left by installing something (apt, pip) over the layers below, so whiteouts and
opaque directories stack the way Docker's overlay2 layers do. On top of every template sits the executor
layer: the in-sandbox daemon and the two wheels it needs, under /opt/agent-sandbox.

A layer's directory is named by a hash of its definition and of everything below it, so editing a template
builds only what changed, and a layer is built into a temporary directory and renamed into place only
when complete.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
import subprocess
import tempfile
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path

import msgspec

from pool._errors import ImageBuildError
from pool._local._id_shift import shift_ids
from pool._local._layer_steps import (
    EXECUTOR_DEPENDENCIES,
    build_debootstrap,
    build_oci,
    install_executor,
    install_executor_wheels,
    run_in_overlay,
)
from pool._local._oci_root import ImageUnfit, inspect_root
from pool._runtime import RegistryLogin
from pool._templates import (
    SANDBOXED_LAYERS,
    AptLayer,
    CopyLayer,
    DebootstrapLayer,
    Layer,
    OciLayer,
    PipLayer,
    SnapshotLayer,
    Template,
)

__all__ = ["ImageStore"]

_BUILDER_VERSION = b"1"
_REFRESHED = "refreshed.json"  # template name -> refresh generation (`ImageStore.record_refresh`)
Log = Callable[[str], None]


class ImageStore:
    """Builds and finds the layer directories of templates in `cache_dir`."""

    def __init__(self, cache_dir: Path, executor_source: Path, *, refreshed: Mapping[str, int] | None = None) -> None:
        """`refreshed`: the refresh generation of these templates' layers (`images build --refresh` builds the
        next one before it records it); every other template's is read from `refreshed.json` at each plan."""
        self._layers = cache_dir / "layers"
        self._executor_source = executor_source
        self._executor_hash = _tree_hash(executor_source, "*.py") + EXECUTOR_DEPENDENCIES.encode()
        self._refreshed = dict(refreshed or {})

    def generation(self, template_name: str) -> int:
        """How often the template's layers were rebuilt against the current archives (0: never)."""
        if template_name in self._refreshed:
            return self._refreshed[template_name]
        return self.recorded_generations().get(template_name, 0)

    def recorded_generations(self) -> dict[str, int]:
        try:
            return msgspec.json.decode((self._layers / _REFRESHED).read_bytes(), type=dict[str, int])
        except (OSError, msgspec.DecodeError):
            return {}

    def _make_layers_dir(self) -> None:
        """The layers directory, root's alone (0700): layers hold what tenants' build steps wrote, setuid-root
        files and file capabilities among them, which no one on the host may run. Sandboxes reach their layers
        through mounts host root makes, never by path."""
        self._layers.mkdir(parents=True, exist_ok=True)
        os.chmod(self._layers, 0o700)

    def record_refresh(self, generations: Mapping[str, int]) -> None:
        """Make `generations` the templates' current ones, once their layers are built: from then on every plan,
        in any process, names the refreshed layers (the old ones stay for the sandboxes pinned to them)."""
        self._make_layers_dir()
        with self._locked():
            merged = {**self.recorded_generations(), **generations}
            temporary = self._layers / f"{_REFRESHED}.tmp"
            temporary.write_bytes(msgspec.json.encode(merged))
            temporary.rename(self._layers / _REFRESHED)

    def layer_dirs(self, template: Template) -> list[Path]:
        """The template's layer directories from the top down (overlayfs `lowerdir` order).

        Raises `ImageBuildError` when a layer is not built yet.
        """
        dirs = [self._layers / key for key, _ in self.plan(template)]
        missing = [d.name for d in dirs if not d.is_dir()]
        if missing:
            raise ImageBuildError(
                f"template {template.name!r} is not built (missing layers {', '.join(missing)}): "
                "run `agent-sandbox images build`"
            )
        return dirs[::-1]

    def is_built(self, template: Template) -> bool:
        return all((self._layers / key).is_dir() for key, _ in self.plan(template))

    def plan(self, template: Template, *, generation: int | None = None) -> list[tuple[str, Layer | None]]:
        """(key, definition) bottom-up, at the template's refresh `generation` (default: its current one); `None`
        stands for the executor layer on top."""
        plan: list[tuple[str, Layer | None]] = []
        digest = hashlib.sha256(_BUILDER_VERSION)
        if generation is None:
            generation = self.generation(template.name)
        if generation:  # 0 leaves the keys as they always were
            digest.update(b"refresh %d" % generation)
        for layer in template.layers:
            digest.update(_identity(layer))
            plan.append((f"{_kind(layer)}-{digest.hexdigest()[:16]}", layer))
        base_key = plan[0][0]
        executor_key = hashlib.sha256(base_key.encode() + self._executor_hash).hexdigest()[:16]
        plan.append((f"executor-{executor_key}", None))
        return plan

    def has(self, key: str) -> bool:
        return (self._layers / key).is_dir()

    def build(self, template: Template, log: Log = print, *, registry: RegistryLogin | None = None) -> list[Path]:
        """Build whatever layers of `template` are missing (blocking; minutes for a fresh base).

        Only the host-built kinds: a missing sandboxed layer (`SANDBOXED_LAYERS`) is an ImageBuildError here;
        the runtime's template builder (`pool._local._template_builder`) makes those. `registry` logs in to
        pull an `OciLayer`'s image.
        """
        self._make_layers_dir()
        with self._locked():
            built: list[Path] = []
            base = template.layers[0]
            for key, layer in self.plan(template):
                target = self._layers / key
                if not target.is_dir():
                    if isinstance(layer, SANDBOXED_LAYERS):
                        raise ImageBuildError(f"layer {key} of template {template.name!r} is built in a sandbox")
                    if isinstance(layer, SnapshotLayer):
                        raise ImageBuildError(f"the snapshot files of template {template.name!r} are gone ({key})")
                    log(f"building layer {key} for template {template.name!r}: {_describe(layer)}")
                    self._build_one(layer, target, built, base=base, registry=registry, log=log)
                built.append(target)
        return built[::-1]

    def layer_path(self, key: str) -> Path:
        """Where the layer `key` is (or would be)."""
        return self._layers / key

    def remove(self, keys: list[str]) -> None:
        """Delete these layers (blocking): moved aside in one rename each, then removed, so no sandbox start sees
        half of one."""
        for key in keys:
            with self._locked():
                target = self._layers / key
                if not target.is_dir():
                    continue
                doomed = self.scratch()
                target.rename(doomed / key)
            shutil.rmtree(doomed, ignore_errors=True)

    def scratch(self) -> Path:
        """A new empty directory on the cache's own filesystem, from which a layer is committed by a rename; its
        caller removes it."""
        self._make_layers_dir()
        return Path(tempfile.mkdtemp(prefix=".scratch-", dir=self._layers))

    def commit(self, key: str, upper: Path, id_base: int) -> Path:
        """Make a build sandbox's writable layer (owned by the ids from `id_base` on) the layer `key`.

        Ids are shifted back to the canonical range (each sandbox maps its layers to its own), then the
        directory is moved into place in one rename; a layer another build committed meanwhile wins.
        """
        self._make_layers_dir()
        target = self._layers / key
        work = Path(tempfile.mkdtemp(prefix=f".{key}-", dir=self._layers))
        try:
            staged = work / "layer"
            if upper.stat().st_dev == self._layers.stat().st_dev:
                upper.rename(staged)
            else:
                subprocess.run(["cp", "-a", "--", str(upper), str(staged)], check=True, capture_output=True)
            shift_ids(staged, id_base)
            with self._locked():
                if not target.is_dir():
                    staged.rename(target)
        except (OSError, subprocess.CalledProcessError) as exc:
            raise ImageBuildError(f"layer {key} could not be stored: {exc}") from exc
        finally:
            shutil.rmtree(work, ignore_errors=True)
        return target

    def _build_one(
        self, layer: Layer | None, target: Path, below: list[Path], *, base: Layer, registry: RegistryLogin | None,
        log: Log,
    ) -> None:  # fmt: skip
        work = Path(tempfile.mkdtemp(prefix=f".{target.name}-", dir=self._layers))
        try:
            upper = work / "layer"
            match layer:
                case DebootstrapLayer():
                    build_debootstrap(layer, upper)
                case OciLayer():
                    build_oci(layer, upper, work, registry, log)
                case AptLayer(packages=packages):
                    run_in_overlay(below[::-1], upper, work, _apt_script(packages))
                case PipLayer(venv=venv, packages=packages):
                    run_in_overlay(below[::-1], upper, work, _pip_script(venv, packages))
                case None if isinstance(base, OciLayer):
                    try:
                        facts = inspect_root(below[0])
                    except ImageUnfit as exc:
                        raise ImageBuildError(f"image {base.image!r} cannot be a sandbox's base here: {exc}") from exc
                    install_executor_wheels(self._executor_source, facts, upper)
                case None:
                    install_executor(self._executor_source, below[0], upper, work)
                case _:
                    raise ImageBuildError(f"layer {target.name} is built in a sandbox, not on the host")
            upper.rename(target)
        except subprocess.CalledProcessError as exc:
            raise ImageBuildError(f"building {target.name} failed: {exc.stderr or exc.stdout or exc}") from exc
        finally:
            shutil.rmtree(work, ignore_errors=True)

    @contextmanager
    def _locked(self) -> Iterator[None]:
        with open(self._layers / ".lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            yield


def _apt_script(packages: list[str]) -> str:
    names = " ".join(packages)
    return (
        "apt-get update -qq\nDEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "
        f"{names}\napt-get clean\nrm -rf /var/lib/apt/lists/*"
    )


def _pip_script(venv: str, packages: list[str]) -> str:
    names = " ".join(f"'{p}'" for p in packages)
    return (
        f"[ -x {venv}/bin/python ] || python3 -m venv {venv}\n"
        f"{venv}/bin/pip install -q --no-cache-dir --disable-pip-version-check {names}\n"
        # Only what the sandbox's users could not read: a blanket chmod would copy a parent layer's whole venv up.
        f"find {venv} \\( ! -perm -o+r -o -type d ! -perm -o+x \\) -exec chmod a+rX {{}} +"
    )


def _kind(layer: Layer) -> str:
    return type(layer).__name__.removesuffix("Layer").lower()


def _describe(layer: Layer | None) -> str:
    match layer:
        case DebootstrapLayer(suite=suite, packages=packages):
            return f"debootstrap {suite} + {len(packages)} packages"
        case OciLayer(image=image, digest=digest):
            return f"image {image}@{digest}"
        case AptLayer(packages=packages) | PipLayer(packages=packages):
            return f"{_kind(layer)} {' '.join(packages)}"
        case None:
            return "the executor"
        case _:
            return _kind(layer)


def _tree_hash(root: Path, pattern: str) -> bytes:
    digest = hashlib.sha256()
    for path in sorted(root.rglob(pattern)):
        digest.update(str(path.relative_to(root)).encode() + b"\0" + path.read_bytes())
    return digest.hexdigest().encode()


def _identity(layer: Layer) -> bytes:
    """What a layer's key is made of: its definition, less where a built-in copy layer's files are (`context`
    says only that they are the templates directory's, so that no upload claiming their hash shares the key);
    an uploaded copy layer is encoded as it was before that field existed."""
    if not isinstance(layer, CopyLayer):
        return msgspec.json.encode(layer)
    fields = msgspec.to_builtins(layer)
    if layer.context:
        fields["context"] = "templates directory"
    else:
        del fields["context"]
    return msgspec.json.encode(fields)
