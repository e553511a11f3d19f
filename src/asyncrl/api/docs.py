"""Render the AsyncTrainingRun reference (docs/crd-reference.md) from the same schema as the CRD.

The field descriptions live on the pydantic models; this page lays them out for people who write manifests,
so that the reference cannot disagree with what the API server enforces. `python -m asyncrl.api.crd --write`
writes it together with the CRD, and `--check` fails when either is stale.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from asyncrl.api.types import meta
from asyncrl.api.types.rules import IMMUTABLE_FIELDS, MUTABLE_FIELDS

HEADER = (
    "<!-- Generated from the pydantic API types in src/asyncrl/api/types/ by asyncrl.api.crd; do not edit.\n"
    "     Regenerate with: python -m asyncrl.api.crd --write -->\n"
)


def render_reference(crd: dict[str, Any]) -> str:
    """The markdown reference of the CRD object `crd` (as `asyncrl.api.crd.crd()` returns it)."""
    (version,) = crd["spec"]["versions"]
    schema = version["schema"]["openAPIV3Schema"]
    lines = [
        HEADER,
        f"# {meta.KIND} reference ({meta.API_VERSION})",
        "",
        f"{schema['description']}",
        "",
        f"Plural `{meta.PLURAL}`, short name `{', '.join(meta.SHORT_NAMES)}`, category "
        f"`{', '.join(meta.CATEGORIES)}`; namespaced; status is a subresource written by the operator.",
        "",
    ]
    for part in ("spec", "status"):
        lines += [f"## {part}", "", "| field | type | default | description |", "|---|---|---|---|"]
        lines += [
            _row(path, node, required) for path, node, required in _fields(schema["properties"][part], part)
        ]
        lines.append("")
    lines += ["## Validation rules (CEL, enforced at admission; local mode raises the same messages)", ""]
    for path, node, _ in _fields(schema["properties"]["spec"], "spec", include_root=True):
        for rule in node.get(meta.VALIDATIONS_KEY, []):
            where = path + rule.get("fieldPath", "")
            lines.append(f"- `{where}`: {rule['message']}")
    lines += [
        "",
        "## Changing a run's spec",
        "",
        "A running run applies an edit of these fields; every other field is immutable (refused at "
        "admission, `self == oldSelf`), so no edit is silently ignored. Each applied edit is announced by "
        "a `SpecChanged` event on the run.",
        "",
        "| field | effect of an edit |",
        "|---|---|",
        *(f"| `spec.{path}` | {effect} |" for path, effect in MUTABLE_FIELDS.items()),
        "",
        f"Immutable: {', '.join(f'`spec.{path}`' for path in IMMUTABLE_FIELDS)}.",
    ]
    lines += ["", "## kubectl get columns", "", "| column | field | shown |", "|---|---|---|"]
    for column in version["additionalPrinterColumns"]:
        shown = "`-o wide`" if column.get("priority", 0) else "always"
        lines.append(f"| {column['name'].upper()} | `{column['jsonPath']}` | {shown} |")
    return "\n".join(lines) + "\n"


def _fields(
    node: dict[str, Any], path: str, *, required: bool = True, include_root: bool = False
) -> Iterator[tuple[str, dict[str, Any], bool]]:
    if include_root:
        yield path, node, required
    needed = set(node.get("required", []))
    for name, child in sorted(node.get("properties", {}).items()):
        child_path = f"{path}.{name}"
        yield child_path, child, name in needed
        yield from _fields(child, child_path, include_root=False)
        if child.get("type") == "array" and "properties" in child.get("items", {}):
            yield from _fields(child["items"], f"{child_path}[]")


def _row(path: str, node: dict[str, Any], required: bool) -> str:
    default = f"`{_literal(node['default'])}`" if "default" in node else ("**required**" if required else "")
    return f"| `{path}` | {_type(node)} | {default} | {_cell(node.get('description', ''))} |"


def _type(node: dict[str, Any]) -> str:
    if "enum" in node:
        return " \\| ".join(f"`{value}`" for value in node["enum"])
    if node.get("x-kubernetes-int-or-string"):
        return "quantity (e.g. `8`, `500m`, `64Gi`)"
    kind = str(node["type"])
    if node.get("x-kubernetes-preserve-unknown-fields"):
        return "object (free-form)"
    if kind == "array":
        return f"list of {_type(node['items'])}"
    if kind == "object" and isinstance(node.get("additionalProperties"), dict):
        return f"map of string to {_type(node['additionalProperties'])}"
    if "format" in node:
        return f"{kind} ({node['format']})"
    low, high = node.get("minimum"), node.get("maximum")
    if low is not None and high is not None:
        return f"{kind}, {low}..{high}"
    if low is not None:
        return f"{kind} {'>' if node.get('exclusiveMinimum') else '>='} {low}"
    if "pattern" in node:
        return f"{kind} matching `{node['pattern']}`"
    return kind


def _literal(value: Any) -> str:
    if isinstance(value, bool):
        return str(value).lower()
    if value == "":
        return '""'
    if isinstance(value, dict | list) and not value:
        return "{}" if isinstance(value, dict) else "[]"
    return str(value)


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")
