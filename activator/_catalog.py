"""The templates sandboxes can be created from, found by name or by alias.

E2B references may carry a namespace and a tag (`team/base:default`). The built-in templates are shared by every
key and have one build, tagged `default`, so a namespace is ignored and `default` is the only tag they have.
"""

from __future__ import annotations

from collections.abc import Mapping

from activator._errors import ActivatorError
from pool import Template

__all__ = ["DEFAULT_TAG", "TemplateCatalog", "TemplateNotFound"]

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
        self.templates = dict(templates)
        self.loaded_at = loaded_at  # unix seconds; E2B's createdAt / updatedAt of every template
        self._names = {**{name: name for name in templates}, **aliases}  # every accepted reference -> template name

    def resolve(self, ref: str) -> Template:
        """The template named `ref` (`[namespace/]name[:tag]`), directly or through an alias."""
        reference, _, tag = ref.rpartition("/")[2].partition(":")
        name = self._names.get(reference)
        if name is None:
            raise TemplateNotFound(f"template '{ref}' not found")
        if tag and tag != DEFAULT_TAG:
            raise TemplateNotFound(f"template '{ref}' not found: '{reference}' has only the tag '{DEFAULT_TAG}'")
        return self.templates[name]

    def names_of(self, name: str) -> list[str]:
        """Every reference that resolves to the template `name`: its own name first, then its aliases."""
        return [name, *sorted(ref for ref, target in self._names.items() if target == name and ref != name)]
