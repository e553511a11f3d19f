"""Check a rendered agent Job against the Job's OpenAPI schema: the fields it may hold and their values.

The API server drops a field it does not know (`comand:`, `resource:`) with at most a warning, so a template
typo ran agents without their command or resources, and `render-agent-job` printed it without a word. The
schema is the Kubernetes Python client's models (generated from the API server's OpenAPI document): each
model's `attribute_map` lists a kind's wire fields and `openapi_types` their types. Label keys and values and
container quantities are checked too (`asyncrl.api.kube_values`), which the schema cannot say and the API
server refuses with a 422 for every Job.

Pure: a parsed Job in, `path: problem` lines out. Not run in the render worker (which holds no Kubernetes
client), but by `asyncrl validate`, `asyncrl render-agent-job` and the operator's start check.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Iterator, Mapping
from functools import cache
from typing import Any

from asyncrl.api.kube_values import label_key_problem, label_problems, resource_problems

JOB_MODEL = "V1Job"
_LIST = re.compile(r"^[Ll]ist\[(.+)\]$")
_DICT = re.compile(r"^[Dd]ict[\[(]str, (.+)[\])]$")  # the client writes Dict[str, X] (older: dict(str, X))
_SCALARS: Mapping[str, tuple[type, ...]] = {
    "str": (str,),
    "int": (int,),
    "bool": (bool,),
    "float": (int, float),
}
_CONTAINER_LISTS = ("containers", "initContainers", "ephemeralContainers")


@cache
def _fields(model: str) -> Mapping[str, str]:
    """The wire names of a client model's fields and their client type strings (`list[V1Container]`)."""
    from kubernetes.client import models

    cls = getattr(models, model)
    return {cls.attribute_map[attribute]: kind for attribute, kind in cls.openapi_types.items()}


def unknown_field_problem(field: str, known: list[str]) -> str:
    close = difflib.get_close_matches(field, known, n=2, cutoff=0.6)
    if not close:
        folded = {name.lower(): name for name in known}
        close = [folded[field.lower()]] if field.lower() in folded else []
    if close:
        return f"unknown field; did you mean {' or '.join(close)}?"
    return "unknown field (not in the batch/v1 Job schema; the API server would drop it)"


def job_schema_problems(job: Mapping[str, Any], *, check_scalars: bool = True) -> list[str]:
    """`path: problem` for every field of `job` the Job schema does not hold, or whose value it refuses.

    `check_scalars`: also compare scalars with their types; off for a render with placeholder values (a
    `<name>` string where the real row has a number)."""
    problems = list(_walk(job, JOB_MODEL, "", check_scalars=check_scalars))
    problems.extend(_value_problems(job))
    return problems


def _walk(value: Any, kind: str, path: str, *, check_scalars: bool) -> Iterator[str]:
    list_of, dict_of = _LIST.match(kind), _DICT.match(kind)
    if list_of is not None:
        if isinstance(value, list):
            for index, item in enumerate(value):
                yield from _walk(item, list_of.group(1), f"{path}[{index}]", check_scalars=check_scalars)
    elif dict_of is not None:
        if isinstance(value, dict) and _is_model(dict_of.group(1)):
            for key, item in value.items():
                yield from _walk(item, dict_of.group(1), f"{path}.{key}", check_scalars=check_scalars)
    elif kind in _SCALARS:
        wrong_bool = isinstance(value, bool) and kind != "bool"
        if check_scalars and value is not None and (wrong_bool or not isinstance(value, _SCALARS[kind])):
            expected = {"str": "a string", "int": "an integer", "bool": "true or false", "float": "a number"}
            yield f"{path}: expected {expected[kind]}, got {value!r}"
    elif _is_model(kind):
        if not isinstance(value, dict):
            return  # job_structure names a wrong shape where the operator needs one; the server the rest
        fields = _fields(kind)
        for key, item in value.items():
            where = f"{path}.{key}" if path else str(key)
            if key not in fields:
                yield f"{where}: {unknown_field_problem(str(key), sorted(fields))}"
            else:
                yield from _walk(item, fields[key], where, check_scalars=check_scalars)
    # `object` (int-or-string, free-form), datetime: left to the API server


def _is_model(kind: str) -> bool:
    """A client model's name (`V1Container`, `CoreV1EventSeries`), not a scalar, list or map."""
    return kind[:1].isupper() and "[" not in kind and kind not in ("Dict", "List")


def _value_problems(job: Mapping[str, Any]) -> Iterator[str]:
    """Label keys and values, annotation keys, nodeSelector, and the containers' quantities."""
    spec = _mapping(job.get("spec"))
    template = _mapping(spec.get("template"))
    pod = _mapping(template.get("spec"))
    for where, metadata in (
        ("metadata", job.get("metadata")),
        ("spec.template.metadata", template.get("metadata")),
    ):
        metadata = _mapping(metadata)
        for key, problem in label_problems(_mapping(metadata.get("labels"))).items():
            yield f"{where}.labels.{key}: {problem}"
        for key in _mapping(metadata.get("annotations")):
            key_problem = label_key_problem(str(key))
            if key_problem is not None:
                yield f"{where}.annotations.{key}: {key_problem.replace('label key', 'annotation key')}"
    for key, problem in label_problems(_mapping(pod.get("nodeSelector"))).items():
        yield f"spec.template.spec.nodeSelector.{key}: {problem}"
    for field in _CONTAINER_LISTS:
        containers = pod.get(field)
        for index, container in enumerate(containers if isinstance(containers, list) else []):
            resources = _mapping(_mapping(container).get("resources"))
            found = resource_problems(_mapping(resources.get("limits")), _mapping(resources.get("requests")))
            for below, problem in found.items():
                yield f"spec.template.spec.{field}[{index}].resources.{below}: {problem}"


def _mapping(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}
