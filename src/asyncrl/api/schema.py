"""Turn a pydantic model's JSON Schema into a Kubernetes structural OpenAPI v3 schema.

The API server accepts only structural schemas for CRDs: every node typed, no `$ref`, no `anyOf` of a type
and null, OpenAPI 3.0 keywords (`exclusiveMinimum` is a boolean there), free-form objects marked with
`x-kubernetes-preserve-unknown-fields`. Pydantic emits JSON Schema 2020-12, so this module rewrites it,
and refuses any construct it cannot express rather than emitting a schema the server would reject.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

from pydantic import BaseModel

# Keywords passed through unchanged once their children are converted.
_PLAIN_KEYWORDS = frozenset(
    {
        "default",
        "description",
        "enum",
        "format",
        "maxItems",
        "maxLength",
        "maxProperties",
        "maximum",
        "minItems",
        "minLength",
        "minProperties",
        "minimum",
        "pattern",
        "type",
        "x-kubernetes-list-map-keys",
        "x-kubernetes-list-type",
        "x-kubernetes-map-type",
        "x-kubernetes-validations",
    }
)
_DROPPED_KEYWORDS = frozenset({"title"})
_INT_OR_STRING = "x-kubernetes-int-or-string"


class SchemaError(ValueError):
    """The model uses a JSON Schema construct that has no structural OpenAPI v3 equivalent."""


def structural_schema(model: type[BaseModel]) -> dict[str, Any]:
    """The structural OpenAPI v3 schema of `model` as it appears on the wire (aliases, validation mode)."""
    raw = model.model_json_schema(by_alias=True, mode="validation")
    definitions: Mapping[str, Any] = raw.pop("$defs", {})
    return _convert(raw, definitions, at=model.__name__)


def _convert(node: Mapping[str, Any], definitions: Mapping[str, Any], *, at: str) -> dict[str, Any]:
    if node.get(_INT_OR_STRING):
        # The one union Kubernetes allows: no type, `anyOf` of integer and string (a resource quantity).
        # A copy: a type used twice (a quantity) would share its lists, which YAML then writes as anchors.
        return copy.deepcopy({key: value for key, value in node.items() if key not in _DROPPED_KEYWORDS})
    node = _resolve(node, definitions, at=at)
    converted: dict[str, Any] = {}
    for key, value in node.items():
        if key in _DROPPED_KEYWORDS:
            continue
        if key == "properties":
            converted[key] = {
                name: _convert(child, definitions, at=f"{at}.{name}") for name, child in value.items()
            }
        elif key == "items":
            converted[key] = _convert(value, definitions, at=f"{at}[]")
        elif key == "required":
            converted[key] = sorted(value)
        elif key == "additionalProperties":
            if value is True:
                converted["x-kubernetes-preserve-unknown-fields"] = True
            elif isinstance(value, Mapping):
                converted[key] = _convert(value, definitions, at=f"{at}{{}}")
            # False: the server prunes unknown fields (and kubectl's strict validation reports them).
        elif key in ("exclusiveMinimum", "exclusiveMaximum"):
            bound = "minimum" if key == "exclusiveMinimum" else "maximum"
            converted[bound] = value
            converted[key] = True
        elif key in _PLAIN_KEYWORDS or key.startswith("x-kubernetes-"):
            converted[key] = copy.deepcopy(value)  # a type used twice must not share lists (YAML anchors)
        else:
            raise SchemaError(f"{at}: JSON Schema keyword {key!r} has no structural OpenAPI v3 form")
    if converted.get("default", ...) is None:
        del converted["default"]  # "optional, no default"; the server has no null default for a non-nullable
    if "type" not in converted:
        raise SchemaError(f"{at}: every node of a structural schema needs a type: {dict(node)}")
    return converted


def _resolve(node: Mapping[str, Any], definitions: Mapping[str, Any], *, at: str) -> Mapping[str, Any]:
    """Inline `$ref`, a single `allOf` and `anyOf: [X, null]`; the node's own keywords override X's."""
    node = dict(node)
    if "$ref" in node:
        name = node.pop("$ref").removeprefix("#/$defs/")
        return {**_resolve(definitions[name], definitions, at=at), **node}
    if "allOf" in node:
        (only,) = node.pop("allOf")
        return {**_resolve(only, definitions, at=at), **node}
    if "anyOf" in node:
        options = [option for option in node.pop("anyOf") if option != {"type": "null"}]
        if len(options) != 1:
            raise SchemaError(f"{at}: unions other than `X | None` have no structural form")
        return {**_resolve(options[0], definitions, at=at), **node}
    return node
