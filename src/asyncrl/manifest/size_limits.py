"""How large a run's manifest may be, at each place it is stored, and which limit a given manifest meets.

A manifest passes through three stores, and the smallest limit on its path decides:

- `kubectl apply` (client-side, the default) copies the whole object as JSON into the annotation
  `kubectl.kubernetes.io/last-applied-configuration`, and the API server allows 256 KiB (262144 bytes) of
  annotations in all, keys and values: a larger manifest is refused with `metadata.annotations: Too long`.
  `kubectl apply --server-side` and `kubectl create` write no such annotation.
- The operator copies the spec and an inline agent template into the run's ConfigMap, which holds 1 MiB of
  data (`children.config_map_size_error`).
- The API server stores an object in one etcd request of at most 1.5 MiB (etcd's --max-request-bytes
  default): never the first limit met, since a spec the ConfigMap holds (1 MiB) plus annotations (256 KiB)
  stays below it, so it is not checked separately.

Rows beyond these sizes belong in a file: `spec.data.configMapRef` (a ConfigMap of its own, 1 MiB; binaryData
parquet) or `spec.data.path` (a volume; no limit). Pure: the parsed manifest in, one message per limit out.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

LAST_APPLIED_ANNOTATION = "kubectl.kubernetes.io/last-applied-configuration"
MAX_ANNOTATION_BYTES = 256 * 1024  # the API server's total of all annotations' keys and values
MAX_NAMESPACE_LENGTH = 63
# Go's encoding/json (kubectl) writes <, > and & as \u003c, \u003e, \u0026: 6 bytes each, not 1.
_GO_ESCAPED = ("<", ">", "&", "\u2028", "\u2029")


def last_applied_bytes(manifest: Mapping[str, Any], *, namespace: str | None = None) -> int:
    """The bytes `kubectl apply` (client-side) adds to the object's annotations for `manifest`.

    kubectl stores the object as given, without its own annotation and with the namespace it applies to
    (`-n`, else the context's), as compact JSON (Go's encoding, which escapes `<`, `>` and `&`) and a newline;
    the annotation counts its key and its value. `namespace`: where it is applied, when the manifest names
    none; unknown, the longest a namespace name can be (63), so the count errs on the safe side."""
    metadata = dict(manifest.get("metadata") or {})
    metadata.setdefault("namespace", namespace or "n" * MAX_NAMESPACE_LENGTH)
    # kubectl removes only its own key: an empty map stays (`"annotations":{}`)
    annotations = metadata.get("annotations") or {}
    metadata["annotations"] = {k: v for k, v in annotations.items() if k != LAST_APPLIED_ANNOTATION}
    text = json.dumps({**manifest, "metadata": metadata}, separators=(",", ":"), ensure_ascii=False)
    escaped = sum(text.count(character) for character in _GO_ESCAPED) * 5
    return len(LAST_APPLIED_ANNOTATION) + len(text.encode()) + escaped + 1


def own_annotation_bytes(manifest: Mapping[str, Any]) -> int:
    metadata = manifest.get("metadata") or {}
    annotations = metadata.get("annotations") or {} if isinstance(metadata, Mapping) else {}
    return sum(len(str(key).encode()) + len(str(value).encode()) for key, value in annotations.items())


def client_side_apply_problem(manifest: Mapping[str, Any], *, namespace: str | None = None) -> str | None:
    """Why `kubectl apply` (client-side) refuses `manifest`, a valid run; None when it does not."""
    total = last_applied_bytes(manifest, namespace=namespace) + own_annotation_bytes(manifest)
    if total <= MAX_ANNOTATION_BYTES:
        return None
    return (
        "too large for `kubectl apply`: it copies the manifest into the annotation "
        f"{LAST_APPLIED_ANNOTATION}, and the annotations would take {total} bytes, over the API server's "
        f"{MAX_ANNOTATION_BYTES} (metadata.annotations: Too long). Apply it with `kubectl apply "
        "--server-side` (or `kubectl create`), and check it here with `asyncrl validate --server-side`; or "
        "move the rows of spec.data.inline into a file (spec.data.configMapRef or spec.data.path)"
    )
