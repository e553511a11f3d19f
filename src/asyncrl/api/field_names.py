"""The field names a manifest may use at a given path, for "did you mean" hints on unknown fields.

They come from the same structural schema the CRD is generated from, so a hint never names a field that the
API server would not accept.
"""

from __future__ import annotations

import difflib
from collections.abc import Mapping, Sequence
from functools import cache
from typing import Any


@cache
def _run_schema() -> Mapping[str, Any]:
    from asyncrl.api.schema import structural_schema
    from asyncrl.api.types.run import AsyncTrainingRun

    return structural_schema(AsyncTrainingRun)


def known_fields(parent: Sequence[str | int]) -> list[str]:
    """Field names of the object at `parent` (wire names; list indices as ints); [] when free-form."""
    node: Mapping[str, Any] = _run_schema()
    for part in parent:
        node = node.get("items", {}) if isinstance(part, int) else node.get("properties", {}).get(part, {})
    return sorted(node.get("properties", {}))


def unknown_field_message(field: str, parent: Sequence[str | int]) -> str:
    """What to say about `field`, unknown under `parent`: the closest known names, or the known names."""
    known = known_fields(parent)
    if not known:
        return "unknown field"
    close = difflib.get_close_matches(field, known, n=2, cutoff=0.6)
    if not close:
        folded = {name.lower(): name for name in known}
        close = [folded[field.lower()]] if field.lower() in folded else []
    if close:
        return f"unknown field; did you mean {' or '.join(close)}?"
    return f"unknown field; the fields here are {', '.join(known)}"
