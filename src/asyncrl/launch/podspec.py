"""Pure translation of a pod's container spec into a local process: argv, environment and paths.

There is no container runtime here, so each image name maps to a local command through an `ImageTable` that
the tests (or local mode) control, and each volume mount path maps to a folder on this machine. Kept free of
I/O so that the Kubernetes rules it mirrors ($(VAR) expansion, command vs. entrypoint, envFrom prefixes) are
tested directly. Local mode's agents and the test pod runner both use it, so it lives outside the harness.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

_VAR_REFERENCE = re.compile(r"\$\(([A-Za-z_][A-Za-z0-9_.-]*)\)|\$\$")


@dataclass(frozen=True)
class Image:
    """What a container image means on this machine: its entrypoint and the environment it bakes in.

    `replace_command` makes the entrypoint replace the container's own `command` too (its `args` are kept):
    a test stand-in for a component whose real program is not available here.
    """

    entrypoint: tuple[str, ...] = ()
    env: Mapping[str, str] = field(default_factory=dict)
    replace_command: bool = False


class ImageTable:
    """Image name → `Image`. A `"*"` entry, when present, serves every image not named."""

    def __init__(self, images: Mapping[str, Image] | None = None) -> None:
        self._images: dict[str, Image] = dict(images or {})

    def __setitem__(self, name: str, image: Image) -> None:
        self._images[name] = image

    def lookup(self, name: str) -> Image | None:
        return self._images.get(name, self._images.get("*"))

    def names(self) -> list[str]:
        return sorted(self._images)


def expand_references(value: str, env: Mapping[str, str]) -> str:
    """Kubernetes' $(VAR) expansion: known names are replaced, unknown ones kept, `$$` escapes a dollar."""

    def replace(match: re.Match[str]) -> str:
        if match.group(0) == "$$":
            return "$"
        name = match.group(1)
        return env.get(name, match.group(0))

    return _VAR_REFERENCE.sub(replace, value)


def container_argv(
    image: Image, command: Sequence[str] | None, args: Sequence[str] | None, env: Mapping[str, str]
) -> list[str]:
    """The process to run: `command` replaces the image entrypoint, then `args`; both get $(VAR) expansion."""
    head = list(command) if command and not image.replace_command else list(image.entrypoint)
    argv = [expand_references(part, env) for part in head + list(args or [])]
    if not argv:
        raise ValueError("container has no command and its image has no entrypoint in the image table")
    return argv


def map_paths(value: str, mounts: Mapping[str, str]) -> str:
    """Rewrite container paths under a mount to the local folder backing it (longest mount first)."""
    for container_path in sorted(mounts, key=len, reverse=True):
        pattern = re.escape(container_path.rstrip("/")) + r"(?=/|$|[\s:;,\"'=])"
        value = re.sub(pattern, mounts[container_path].replace("\\", "\\\\"), value)
    return value


def pod_field(pod: Mapping[str, Any], field_path: str) -> str:
    """The value of a downward-API `fieldRef` path on a pod given as the API's JSON dict."""
    metadata = pod.get("metadata") or {}
    spec = pod.get("spec") or {}
    status = pod.get("status") or {}
    label_or_annotation = re.fullmatch(r"metadata\.(labels|annotations)\['([^']+)'\]", field_path)
    if label_or_annotation:
        mapping = metadata.get(label_or_annotation.group(1)) or {}
        return str(mapping.get(label_or_annotation.group(2), ""))
    simple = {
        "metadata.name": metadata.get("name"),
        "metadata.namespace": metadata.get("namespace"),
        "metadata.uid": metadata.get("uid"),
        "spec.nodeName": spec.get("nodeName"),
        "spec.serviceAccountName": spec.get("serviceAccountName"),
        "status.podIP": status.get("podIP") or "127.0.0.1",
        "status.hostIP": status.get("hostIP") or "127.0.0.1",
    }
    if field_path not in simple:
        raise ValueError(f"unsupported fieldRef {field_path!r}")
    return str(simple[field_path] or "")
