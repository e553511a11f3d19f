"""Check that a rendered agent Job has the shape the operator and the API server need, naming the first path
that does not.

A template typo (`containers: [agent]`, `spec: oops`, `env: [X]`) parses as valid YAML of the wrong shape;
without this check it surfaced as an uncaught `AttributeError` deep in the Job shaping, or as a 4xx from the
API server for every rollout. Here it is one line that names the path and what was expected, found at the
start of a run by rendering a sample row. Only the fields the operator touches or that are certain to be
rejected are checked; everything else is left to the API server.
"""

from __future__ import annotations

import math
from typing import Any

from asyncrl.agent_templates.errors import TemplateError

POD_SPEC = "spec.template.spec"
CONTAINER_LISTS = ("containers", "initContainers")


def describe(value: Any) -> str:
    """`the string 'agent'`, `the integer 7`, `a list`: what a wrong value was, briefly."""
    if value is None:
        return "nothing (null)"
    if isinstance(value, bool):
        return f"the boolean {str(value).lower()}"
    if isinstance(value, str):
        shown = value if len(value) <= 40 else value[:39] + "…"
        return f"the string {shown!r}"
    if isinstance(value, int):
        return f"the integer {value}"
    if isinstance(value, float):
        return f"the number {value}"
    if isinstance(value, list):
        return "a list"
    if isinstance(value, dict):
        return "a mapping"
    return f"a YAML {type(value).__name__} (quote it to make it text)"


def _fail(path: str, expected: str, value: Any) -> TemplateError:
    return TemplateError(f"agent template: {path}: expected {expected}, got {describe(value)}")


def check_job_structure(job: Any) -> None:
    """Raise TemplateError naming the first path of `job` that cannot be a valid agent Job."""
    if not isinstance(job, dict) or job.get("apiVersion") != "batch/v1" or job.get("kind") != "Job":
        kind = f"{job.get('apiVersion')}/{job.get('kind')}" if isinstance(job, dict) else describe(job)
        raise TemplateError(f"agent template must render a batch/v1 Job; got {kind}")
    _check_plain_data(job, "")
    _check_metadata(job.get("metadata"), "metadata")
    spec = _mapping(job.get("spec"), "spec", required=True)
    template = _mapping(spec.get("template"), "spec.template", required=True)
    _check_metadata(template.get("metadata"), "spec.template.metadata")
    pod = _mapping(template.get("spec"), POD_SPEC, required=True)
    containers = pod.get("containers")
    if not isinstance(containers, list) or not containers:
        raise _fail(
            f"{POD_SPEC}.containers", "a non-empty list of containers (each with name and image)", containers
        )
    for field in CONTAINER_LISTS:
        for index, container in enumerate(_list(pod.get(field), f"{POD_SPEC}.{field}")):
            _check_container(container, f"{POD_SPEC}.{field}[{index}]")
    for index, volume in enumerate(_list(pod.get("volumes"), f"{POD_SPEC}.volumes")):
        _named(volume, f"{POD_SPEC}.volumes[{index}]", "a mapping with a name (a volume)")
    _list(pod.get("imagePullSecrets"), f"{POD_SPEC}.imagePullSecrets")


def _check_plain_data(value: Any, path: str) -> None:
    """Only JSON data reaches the API: string keys; no dates, binary or NaN that YAML can produce."""
    stack: list[tuple[Any, str]] = [(value, path)]
    while stack:
        item, where = stack.pop()
        if isinstance(item, dict):
            for key, child in item.items():
                if not isinstance(key, str):
                    where = where or "the top level"
                    raise TemplateError(f"agent template: {where}: the key {key!r} is not a string; quote it")
                stack.append((child, f"{where}.{key}" if where else key))
        elif isinstance(item, list):
            stack.extend((child, f"{where}[{index}]") for index, child in enumerate(item))
        elif isinstance(item, float) and not math.isfinite(item):
            raise _fail(where, "a finite number or a string", item)
        elif item is not None and not isinstance(item, str | int | float | bool):
            raise _fail(where, "JSON data (text, a number, true/false, a list or a mapping)", item)


def _mapping(value: Any, path: str, *, required: bool = False) -> dict[str, Any]:
    if value is None and not required:
        return {}
    if not isinstance(value, dict):
        raise _fail(path, "a mapping", value)
    return value


def _list(value: Any, path: str) -> list[Any]:
    if value is None:
        return []
    if not isinstance(value, list):
        raise _fail(path, "a list", value)
    return value


def _strings(value: Any, path: str) -> None:
    for index, item in enumerate(_list(value, path)):
        if not isinstance(item, str):
            raise _fail(f"{path}[{index}]", 'a string (quote a number: "8")', item)


def _string_map(value: Any, path: str) -> None:
    for key, item in _mapping(value, path).items():
        if not isinstance(item, str):
            raise _fail(f"{path}.{key}", 'a string (quote it: "1")', item)


def _named(value: Any, path: str, expected: str, *more: str) -> dict[str, Any]:
    """A mapping whose `name` (and each key of `more`) is a non-empty string."""
    if not isinstance(value, dict):
        raise _fail(path, expected, value)
    for key in ("name", *more):
        if not isinstance(value.get(key), str) or not value[key]:
            raise _fail(f"{path}.{key}", "a non-empty string", value.get(key))
    return value


def _check_metadata(value: Any, path: str) -> None:
    metadata = _mapping(value, path)
    _string_map(metadata.get("labels"), f"{path}.labels")
    _string_map(metadata.get("annotations"), f"{path}.annotations")


def _check_container(value: Any, path: str) -> None:
    container = _named(value, path, "a mapping with name and image", "image")
    _strings(container.get("command"), f"{path}.command")
    _strings(container.get("args"), f"{path}.args")
    for index, entry in enumerate(_list(container.get("env"), f"{path}.env")):
        _check_env(entry, f"{path}.env[{index}]")
    for index, entry in enumerate(_list(container.get("envFrom"), f"{path}.envFrom")):
        _mapping(entry, f"{path}.envFrom[{index}]", required=True)
    for index, port in enumerate(_list(container.get("ports"), f"{path}.ports")):
        _mapping(port, f"{path}.ports[{index}]", required=True)
    for index, mount in enumerate(_list(container.get("volumeMounts"), f"{path}.volumeMounts")):
        _named(mount, f"{path}.volumeMounts[{index}]", "a mapping with name and mountPath", "mountPath")
    resources = _mapping(container.get("resources"), f"{path}.resources")
    for kind in ("limits", "requests"):
        for name, quantity in _mapping(resources.get(kind), f"{path}.resources.{kind}").items():
            if isinstance(quantity, bool) or not isinstance(quantity, str | int | float):
                raise _fail(f"{path}.resources.{kind}.{name}", 'a quantity such as "500m" or "1Gi"', quantity)
    _mapping(container.get("securityContext"), f"{path}.securityContext")


def _check_env(value: Any, path: str) -> None:
    entry = _named(value, path, "a mapping with a name (and a value or valueFrom)")
    if "value" in entry and entry["value"] is not None and not isinstance(entry["value"], str):
        raise _fail(
            f"{path}.value",
            'a string; quote the value (value: "{{ n }}") or use {{ n | tojson }}',
            entry["value"],
        )
    _mapping(entry.get("valueFrom"), f"{path}.valueFrom")
