"""Render an agent Job from the user's Jinja template and one rollout's dataset row, safely.

Dataset text is untrusted: it must never inject YAML structure or template code. So the template is rendered
in Jinja's sandbox, and every `{{ expression }}` first renders as an opaque random placeholder; the YAML is
parsed with placeholders in place, and only then are the real values put into the parsed strings. A value can
therefore only ever become the content of one scalar, whatever quotes, newlines or braces it holds. A
placeholder that makes up a whole unquoted scalar keeps the value's type (a number stays a number); inside
quotes or within a longer string the value becomes text.
"""

from __future__ import annotations

import json
import re
import secrets
from collections.abc import Mapping
from typing import Any

import jinja2
import yaml
from jinja2.sandbox import ImmutableSandboxedEnvironment

from asyncrl.gateway.models import RolloutView


class TemplateError(ValueError):
    """The template does not render to exactly one batch/v1 Job; the message says where and why."""


def _environment(finalize: Any) -> ImmutableSandboxedEnvironment:
    environment = ImmutableSandboxedEnvironment(
        undefined=jinja2.StrictUndefined,
        autoescape=False,
        keep_trailing_newline=True,
        finalize=finalize,
    )
    # Templates written for plain Jinja-to-YAML often quote values with `| tojson`. Here every value is
    # already embedded safely, so `tojson` adds no second quoting: a string stays the string, anything else
    # becomes its JSON text (e.g. a whole row as one env value).
    environment.filters["tojson"] = _tojson
    return environment


def rollout_variables(
    rollout: RolloutView, *, attempt_id: str, job_name: str, run_name: str, namespace: str
) -> dict[str, Any]:
    """The template variables of one rollout (operator and local mode alike)."""
    return template_variables(
        rollout.input,
        rollout={
            "id": rollout.rollout_id,
            "group_id": rollout.group_id,
            "step": rollout.step,
            "attempt_id": attempt_id,
            "mode": rollout.mode,
        },
        job_name=job_name,
        run={"name": run_name, "namespace": namespace},
    )


def _tojson(value: Any, *_args: Any, **_kwargs: Any) -> Any:
    if isinstance(value, jinja2.Undefined):
        str(value)  # StrictUndefined raises UndefinedError, naming what is missing
    if isinstance(value, str):
        return value
    return json.dumps(value, sort_keys=True)


def template_variables(
    row: Any, *, rollout: Mapping[str, Any], job_name: str, run: Mapping[str, Any]
) -> dict[str, Any]:
    """A template's variables: the row's fields by name (when the row is an object), the row as `input`,
    and `rollout` (id, group_id, step, attempt_id, mode), `job_name` and `run` (name, namespace), which win
    over row fields of the same name."""
    variables: dict[str, Any] = dict(row) if isinstance(row, Mapping) else {}
    variables.update(input=row, rollout=dict(rollout), job_name=job_name, run=dict(run))
    return variables


def check_template(source: str) -> None:
    """Raise TemplateError when `source` is not even valid Jinja (checked once, when a run is created)."""
    try:
        _environment(None).parse(source)
    except jinja2.TemplateSyntaxError as error:
        raise TemplateError(f"agent template line {error.lineno}: {error.message}") from error


def render_job(source: str, variables: Mapping[str, Any]) -> dict[str, Any]:
    """The Job described by `source` with `variables` (e.g. input, rollout, job_name) filled in."""
    nonce = secrets.token_hex(8)
    values: list[Any] = []

    def placeholder(value: Any) -> str:
        if isinstance(value, jinja2.Undefined):
            str(value)  # StrictUndefined raises UndefinedError, naming what is missing
        values.append(value)
        return f"__asyncrl_{nonce}_{len(values) - 1}__"  # a valid plain YAML scalar anywhere

    try:
        rendered = _environment(placeholder).from_string(source).render(**variables)
    except jinja2.TemplateSyntaxError as error:
        raise TemplateError(f"agent template line {error.lineno}: {error.message}") from error
    except jinja2.UndefinedError as error:
        raise TemplateError(f"agent template: {error.message}") from error
    except jinja2.exceptions.SecurityError as error:
        raise TemplateError(f"agent template: not allowed in the sandbox: {error}") from error
    except Exception as error:  # a filter or expression failing on this row's data
        raise TemplateError(
            f"agent template failed for this rollout: {type(error).__name__}: {error}"
        ) from error
    try:
        documents = [doc for doc in yaml.safe_load_all(rendered) if doc is not None]
    except yaml.YAMLError as error:
        raise TemplateError(f"agent template does not render valid YAML: {error}") from error
    if len(documents) != 1:
        raise TemplateError(
            f"agent template must render exactly one document (a batch/v1 Job); got {len(documents)}"
        )
    pattern = re.compile(f"__asyncrl_{nonce}_(\\d+)__")
    quoted = _quoted_placeholders(rendered, pattern)
    job = _substitute(documents[0], pattern, values, quoted)
    if not isinstance(job, dict) or job.get("apiVersion") != "batch/v1" or job.get("kind") != "Job":
        kind = f"{job.get('apiVersion')}/{job.get('kind')}" if isinstance(job, dict) else type(job).__name__
        raise TemplateError(f"agent template must render a batch/v1 Job; got {kind}")
    containers = job.get("spec", {}).get("template", {}).get("spec", {}).get("containers")
    if not isinstance(containers, list) or not containers:
        raise TemplateError("agent template's Job has no spec.template.spec.containers")
    return job


def _quoted_placeholders(rendered: str, pattern: re.Pattern[str]) -> set[int]:
    """Placeholders inside quoted scalars: the author asked for text there (`value: "{{ n }}"`)."""
    quoted: set[int] = set()
    stack = list(yaml.compose_all(rendered))
    while stack:
        node = stack.pop()
        if isinstance(node, yaml.ScalarNode):
            if node.style in ('"', "'"):
                quoted.update(int(index) for index in pattern.findall(node.value))
        elif isinstance(node, yaml.SequenceNode):
            stack.extend(node.value)
        elif isinstance(node, yaml.MappingNode):
            stack.extend(item for pair in node.value for item in pair)
    return quoted


def _substitute(node: Any, pattern: re.Pattern[str], values: list[Any], quoted: set[int]) -> Any:
    if isinstance(node, dict):
        return {
            _substitute(key, pattern, values, quoted): _substitute(value, pattern, values, quoted)
            for key, value in node.items()
        }
    if isinstance(node, list):
        return [_substitute(item, pattern, values, quoted) for item in node]
    if isinstance(node, str):
        whole = pattern.fullmatch(node)
        if whole and int(whole.group(1)) not in quoted:
            return values[int(whole.group(1))]
        return pattern.sub(lambda match: _as_text(values[int(match.group(1))]), node)
    return node


def _as_text(value: Any) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return ""
    if isinstance(value, int | float):
        return str(value)
    import json

    return json.dumps(value, sort_keys=True)
