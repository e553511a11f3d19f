"""The field names a manifest may use at a given path, for "did you mean" hints on unknown fields.

The names are read from the structural schema the CRD is generated from (the caller passes it: the run's
types sit above this module), so a hint never names a field that the API server would not accept. Pure.
"""

from __future__ import annotations

import difflib
from collections.abc import Mapping, Sequence
from typing import Any


def known_fields(schema: Mapping[str, Any], parent: Sequence[str | int]) -> list[str]:
    """Field names of the object at `parent` (wire names; list indices as ints); [] when free-form."""
    node: Mapping[str, Any] = schema
    for part in parent:
        node = node.get("items", {}) if isinstance(part, int) else node.get("properties", {}).get(part, {})
    return sorted(node.get("properties", {}))


def unknown_field_message(field: str, parent: Sequence[str | int], *, schema: Mapping[str, Any]) -> str:
    """What to say about `field`, unknown under `parent`: the closest known names, or the known names."""
    known = known_fields(schema, parent)
    if not known:
        return "unknown field"
    close = difflib.get_close_matches(field, known, n=2, cutoff=0.6)
    if not close:
        folded = {name.lower(): name for name in known}
        close = [folded[field.lower()]] if field.lower() in folded else []
    if close:
        return f"unknown field; did you mean {' or '.join(close)}?"
    return f"unknown field; the fields here are {', '.join(known)}"
