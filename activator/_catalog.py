"""The templates sandboxes can be created from, found by name or by alias.

E2B references may carry a namespace and a tag (`team/base:default`). The built-in templates (the operator's
TOML files) are shared by every key and have one build, tagged `default`, so a namespace is ignored and
`default` is the only tag they have. Templates a key built (`_template_records`) are that key's alone, found by
name or template ID, each tag naming one of their builds; a key's own template hides a built-in of its name.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from activator._errors import ActivatorError
from activator._template_records import BuildRecord, TemplateRecord
from pool import Template

__all__ = ["DEFAULT_TAG", "TemplateCatalog", "TemplateNotFound", "build_key", "split_reference"]

DEFAULT_TAG = "default"  # E2B's tag of a template's build when none is named


class TemplateNotFound(ActivatorError):
    """No template has this name or alias (E2B answers 404 "template 'x' not found", not 400)."""

    status_code = 404


class TemplateCatalog:
    """Resolves the `templateID` of a request to a loaded template."""

    def __init__(self, templates: Mapping[str, Template], aliases: Mapping[str, str], *, loaded_at: float) -> None:
        dangling = sorted(alias for alias, name in aliases.items() if name not in templates)
        if dangling:
            raise ValueError(f"template aliases name unknown templates: {', '.join(dangling)}")
        # Every template a sandbox record may name: built-ins by name, finished builds by `build_key`.
        self.templates = dict(templates)
        self.loaded_at = loaded_at  # unix seconds; E2B's createdAt / updatedAt of every built-in template
        self._builtins = frozenset(templates)
        self._names = {**{name: name for name in templates}, **aliases}  # every accepted reference -> template name
        self._built: dict[str, TemplateRecord] = {}  # template id -> record

    def builtins(self) -> dict[str, Template]:
        """The built-in templates by name."""
        return {name: self.templates[name] for name in self._builtins}

    def is_builtin(self, name: str) -> bool:
        """Whether `name` is a built-in template's name or alias (no key may build one by that name)."""
        return name in self._names

    def put_built(self, record: TemplateRecord, builds: Iterable[BuildRecord] = ()) -> None:
        """Add or replace a key's template, with the finished builds its sandboxes may start from (a deleted one's
        builds only, for the sandboxes standing on them)."""
        if not record.deleted:
            self._built[record.template_id] = record
        for build in builds:
            if build.template is not None:
                self.templates[build_key(record.template_id, build.build_id)] = build.template

    def remove_built(self, template_id: str) -> None:
        """Forget a key's template: no new sandbox starts from it (running ones keep their layers)."""
        self._built.pop(template_id, None)

    def tagged(self) -> list[Template]:
        """The builds a tag of some key's template names: every template a create may still start from, but the
        built-in ones."""
        keys = (build_key(r.template_id, build_id) for r in self._built.values() for build_id in r.tags.values())
        return [self.templates[key] for key in keys if key in self.templates]

    def built(self, owner: str) -> list[TemplateRecord]:
        """The templates `owner` built, oldest first."""
        return sorted((r for r in self._built.values() if r.owner == owner), key=lambda r: r.created_at)

    def find_built(self, owner: str, reference: str) -> TemplateRecord | None:
        """`owner`'s template whose name or template ID is `reference` (no namespace, no tag)."""
        record = self._built.get(reference)
        if record is not None and record.owner == owner:
            return record
        return next((r for r in self._built.values() if r.owner == owner and r.name == reference), None)

    def resolve(self, ref: str, owner: str | None = None) -> Template:
        """The template named `ref` (`[namespace/]name[:tag]`): `owner`'s own first, then a built-in, directly or
        through an alias."""
        reference, tag = split_reference(ref)
        own = self.find_built(owner, reference) if owner is not None else None
        if own is not None:
            build_id = own.tags.get(tag or DEFAULT_TAG)
            if build_id is None or build_key(own.template_id, build_id) not in self.templates:
                raise TemplateNotFound(f"template '{ref}' not found: '{reference}' has no ready build tagged "
                                       f"'{tag or DEFAULT_TAG}'")  # fmt: skip
            return self.templates[build_key(own.template_id, build_id)]
        name = self._names.get(reference)
        if name is None:
            raise TemplateNotFound(f"template '{ref}' not found")
        if tag and tag != DEFAULT_TAG:
            raise TemplateNotFound(f"template '{ref}' not found: '{reference}' has only the tag '{DEFAULT_TAG}'")
        return self.templates[name]

    def names_of(self, name: str) -> list[str]:
        """Every reference that resolves to the built-in template `name`: its own name first, then its aliases."""
        return [name, *sorted(ref for ref, target in self._names.items() if target == name and ref != name)]


def split_reference(ref: str) -> tuple[str, str]:
    """(name, tag) of an E2B template reference `[namespace/]name[:tag]`; tag "" when none is named."""
    reference, _, tag = ref.rpartition("/")[2].partition(":")
    return reference, tag


def build_key(template_id: str, build_id: str) -> str:
    """The name a build's `pool.Template` has in the catalog and in its sandboxes' records."""
    return f"{template_id}/{build_id}"
