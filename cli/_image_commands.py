"""`agent-sandbox images build`: build template layers ahead of time (the first build takes a minute)."""

from __future__ import annotations

import sys
from pathlib import Path

from gateway import ServeSettings
from pool import ImageBuildError, ImageStore, TemplateError, load_templates

__all__ = ["build_images"]


def build_images(templates_dir: Path, cache: Path, names: list[str]) -> None:
    try:
        templates = load_templates(templates_dir)
    except TemplateError as exc:
        sys.exit(f"agent-sandbox: {exc}")
    unknown = sorted(set(names) - templates.keys())
    if unknown:
        sys.exit(f"agent-sandbox: unknown templates: {', '.join(unknown)} (known: {', '.join(sorted(templates))})")
    store = ImageStore(cache, ServeSettings().executor_source)
    for name in names or sorted(templates):
        try:
            store.build(templates[name], log=lambda line: print(f"agent-sandbox: {line}", flush=True))
        except ImageBuildError as exc:
            sys.exit(f"agent-sandbox: {exc}")
