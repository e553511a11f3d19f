"""kopf's last-handled-configuration, without a second copy of a run's inline rows and template.

kopf keeps the spec it last handled (its diff base, for `@kopf.on.update(field="spec")`) as JSON in an
annotation, and the API server allows 256 KiB of annotations in all. A run with a few hundred KiB of inline
rows was applied (`kubectl apply --server-side`, or client-side under 128 KiB beside kubectl's own copy) and
then every kopf patch of that annotation failed (`metadata.annotations: Too long`), with ERROR tracebacks
and nothing in the run's events or status. Here the two fields that can be that large, `spec.data.inline`
and `spec.agents.template.inline`, are kept in the annotation as a digest of their content: a change to them
is still a change of the spec (the digest differs), and the handlers read the spec from the body, never
from kopf's `old`/`new` copies of these fields.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable
from typing import Any

import kopf

# Fields of the spec (paths below the object) that may hold up to the ConfigMap's 1 MiB.
LARGE_FIELDS = (("spec", "data", "inline"), ("spec", "agents", "template", "inline"))


def digest(value: Any) -> dict[str, str]:
    """What stands for a large field in the diff base: the sha256 of its canonical JSON."""
    text = json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return {"sha256": hashlib.sha256(text.encode()).hexdigest()}


class RunDiffBaseStorage(kopf.AnnotationsDiffBaseStorage):
    """kopf's annotation diff base, with each of LARGE_FIELDS replaced by its digest."""

    def build(self, *, body: kopf.Body, extra_fields: Iterable[Any] | None = None) -> kopf.BodyEssence:
        essence = super().build(body=body, extra_fields=extra_fields)
        for path in LARGE_FIELDS:
            *parents, last = path
            node: Any = essence
            for part in parents:
                node = node.get(part) if isinstance(node, dict) else None
            if isinstance(node, dict) and last in node:
                node[last] = digest(node[last])
        return essence
