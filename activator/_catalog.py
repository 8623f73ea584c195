"""The templates sandboxes can be created from, found by name or by alias."""

from __future__ import annotations

from collections.abc import Mapping

from activator._errors import ActivatorError
from pool import Template

__all__ = ["TemplateCatalog", "TemplateNotFound"]


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
        """The template named `ref`, directly or through an alias."""
        name = self._names.get(ref)
        if name is None:
            raise TemplateNotFound(f"template '{ref}' not found")
        return self.templates[name]

    def names_of(self, name: str) -> list[str]:
        """Every reference that resolves to the template `name`: its own name first, then its aliases."""
        return [name, *sorted(ref for ref, target in self._names.items() if target == name and ref != name)]
