"""Kubernetes objects checked against the schemas kubernetes-validate ships, more strictly than its command.

`kubernetes-validate --strict` exits 0 for an object whose API version it has no schema for (a removed API,
such as `policy/v1beta1` PodDisruptionBudget: it only prints a WARN line), and it knows nothing of
deprecations. `problems` reports both: a missing schema as a problem, and every kind or field whose schema
description says it is deprecated (Kubernetes writes that into its OpenAPI descriptions, e.g. "Deprecated:
This API is deprecated in v1.33+" on v1 Endpoints, "Deprecated: Use serviceAccountName instead" on a pod's
`serviceAccount`).
"""

from __future__ import annotations

import functools
import json
import re
from importlib import resources
from typing import Any

import kubernetes_validate  # type: ignore[import-untyped]  # ships no annotations; validate() and its errors

__all__ = ["OLDEST", "problems", "schema_versions"]

OLDEST = "1.28.0"  # the oldest Kubernetes install.yaml supports
# How the API descriptions mark a deprecated kind or field; not every mention of the word (an Ingress's
# `ingressClassName` says that the annotation it replaces is deprecated).
_DEPRECATED = re.compile(
    r"\b(?:Deprecated|DEPRECATED)[:.]"  # "Deprecated: This API is deprecated in v1.33+", "DEPRECATED: GitRepo ..."
    r"|\b[Tt]his (?:API|field) is deprecated\b"
    r"|\bis (?:a|the) deprecated (?:alias|field)\b"
)


def schema_versions() -> list[str]:
    """The oldest supported version and the newest whose schemas kubernetes-validate ships."""
    return [OLDEST, kubernetes_validate.latest_version()]


def problems(document: dict[str, Any], version: str) -> list[str]:
    """What is wrong with `document` for Kubernetes `version`: schema errors (strict: no unknown fields), no
    schema for its kind and API version, and deprecated kinds or fields it uses. Empty: nothing."""
    name = f"{document.get('kind')} {document.get('metadata', {}).get('name')} ({document.get('apiVersion')})"
    try:
        kubernetes_validate.validate(document, version, strict=True)
    except kubernetes_validate.SchemaNotFoundError as exc:
        return [f"{name}: {exc.message}"]
    except kubernetes_validate.ValidationError as exc:
        return [f"{name}: {'.'.join(map(str, exc.path))}: {exc.message}"]
    schema, definitions = _schemas(version, document["kind"], document["apiVersion"])
    return [f"{name}: {path}: {text}" for path, text in _deprecated(document, schema, definitions, "")]


@functools.cache
def _schemas(version: str, kind: str, api_version: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """The strict schema of `kind` in `api_version` and the definitions it refers to, as `validate` read them."""
    directory = resources.files("kubernetes_validate") / "kubernetes-json-schema" / f"v{version}-local-strict"
    group_version = re.sub(r"^([^./]*)(?:\.[^/]*)?/", r"\1-", api_version)  # apps/v1 -> apps-v1, as validate
    schema = json.loads((directory / f"{kind.lower()}-{group_version}.json").read_text())
    definitions = json.loads((directory / "_definitions.json").read_text())["$defs"]
    return schema, definitions


def _deprecated(value: Any, schema: dict[str, Any], definitions: dict[str, Any], path: str) -> list[tuple[str, str]]:
    """(path, description) of each part of `value` that `schema` describes as deprecated."""
    descriptions = [schema.get("description", "")]
    while "$ref" in schema:  # a field's own description, then its type's
        schema = definitions[schema["$ref"].rsplit("/", 1)[1]]
        descriptions.append(schema.get("description", ""))
    found = [(path or ".", text) for text in descriptions if _DEPRECATED.search(text)][:1]
    if isinstance(value, dict):
        fields = schema.get("properties", {})
        extra = schema.get("additionalProperties")
        for key, item in value.items():
            field = fields.get(key, extra if isinstance(extra, dict) else None)
            if field is not None:
                found += _deprecated(item, field, definitions, f"{path}.{key}")
    elif isinstance(value, list) and isinstance(schema.get("items"), dict):
        for index, item in enumerate(value):
            found += _deprecated(item, schema["items"], definitions, f"{path}[{index}]")
    return found
