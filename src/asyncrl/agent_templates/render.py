"""Render an agent Job from the user's Jinja template and one rollout's dataset row, safely.

Dataset text is untrusted: it must never inject YAML structure or template code. So the template is rendered
in Jinja's sandbox, and every `{{ expression }}` first renders as an opaque random placeholder; the YAML is
parsed with placeholders in place, and only then are the real values put into the parsed strings. A value can
therefore only ever become the content of one scalar, whatever quotes, newlines or braces it holds. A
placeholder that makes up a whole unquoted scalar keeps the value's type (a number stays a number); inside
quotes or within a longer string the value becomes text. A placeholder can never be a mapping key: keys are
structure.

Rendering is bounded (`RenderLimits`): the rendered text stops at a size, and YAML aliases may not expand
past a node count (a "billion laughs" document is refused before anything walks it). Time is bounded by the
caller: the operator runs this module in a worker process with a deadline (`renderer.py`). The result is
checked to have the shape of an agent Job (`job_structure.py`), so a typo is one error naming its path.
"""

from __future__ import annotations

import json
import re
import secrets
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import jinja2
import yaml
from jinja2.sandbox import ImmutableSandboxedEnvironment

from asyncrl.agent_templates.errors import TemplateError
from asyncrl.agent_templates.job_structure import check_job_structure

if TYPE_CHECKING:  # the render worker imports this module; it needs no pydantic models
    from asyncrl.gateway_api.models import RolloutView

__all__ = [
    "RenderLimits",
    "TemplateError",
    "render_job",
    "rollout_variables",
    "sample_variables",
    "template_variables",
]

YAML_NULL_TAG = "tag:yaml.org,2002:null"


@dataclass(frozen=True)
class RenderLimits:
    """What one render may produce. Time is the worker's deadline (`renderer.RenderSettings`)."""

    max_rendered_chars: int = 256 * 1024  # the template's text output, before values are filled in
    max_yaml_nodes: int = 20_000  # YAML nodes after expanding aliases
    max_job_bytes: int = 1024 * 1024  # the finished Job as JSON (an API object must stay well under 1.5 MiB)


DEFAULT_LIMITS = RenderLimits()


class SampleUndefined(jinja2.ChainableUndefined):
    """A name missing from a placeholder row renders as `<name>` (for the start check without real data)."""

    def __str__(self) -> str:
        return f"<{self._undefined_name or 'value'}>"

    def _fail_with_undefined_error(self, *args: Any, **kwargs: Any) -> Any:
        try:
            return super()._fail_with_undefined_error(*args, **kwargs)
        except jinja2.UndefinedError as error:
            raise TemplateError(
                f"agent template: {error.message} (in a render for a placeholder row)", row_dependent=True
            ) from error


def _environment(finalize: Any, *, sample: bool = False) -> ImmutableSandboxedEnvironment:
    environment = ImmutableSandboxedEnvironment(
        undefined=SampleUndefined if sample else jinja2.StrictUndefined,
        autoescape=False,
        keep_trailing_newline=True,
        finalize=finalize,
    )
    # Templates written for plain Jinja-to-YAML often quote values with `| tojson`. Here every value is
    # already embedded safely, so `tojson` adds no second quoting: a string stays the string, anything else
    # becomes its JSON text (e.g. a whole row as one env value).
    environment.filters["tojson"] = _tojson
    # Agent Lightning v1.0 Job templates quote every value with `| yaml_escape`: the same no-op here, so
    # those templates render unchanged (docs/migrating-from-agent-lightning.md).
    environment.filters["yaml_escape"] = _tojson
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


def sample_variables(
    row: Any | None, *, run_name: str, namespace: str, job_name: str, attempt_id: str
) -> dict[str, Any]:
    """Variables for checking a template before any rollout: `row` (a real first row), or, when None, an empty
    row whose missing names render as `<name>` (render with `sample=True`)."""
    return template_variables(
        {} if row is None else row,
        rollout={"id": "sample", "group_id": "sample", "step": 0, "attempt_id": attempt_id, "mode": "train"},
        job_name=job_name,
        run={"name": run_name, "namespace": namespace},
    )


def _tojson(value: Any, *_args: Any, **_kwargs: Any) -> Any:
    if isinstance(value, jinja2.Undefined):
        return str(value)  # StrictUndefined raises UndefinedError, naming what is missing
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


def render_job(
    source: str,
    variables: Mapping[str, Any],
    *,
    limits: RenderLimits = DEFAULT_LIMITS,
    sample: bool = False,
) -> dict[str, Any]:
    """The Job described by `source` with `variables` (e.g. input, rollout, job_name) filled in.

    `sample`: names missing from the row render as `<name>` instead of failing (a placeholder row)."""
    nonce = secrets.token_hex(8)
    values: list[Any] = []

    def placeholder(value: Any) -> str:
        if isinstance(value, jinja2.Undefined):
            value = str(value)  # StrictUndefined raises UndefinedError, naming what is missing
        values.append(value)
        return f"__asyncrl_{nonce}_{len(values) - 1}__"  # a valid plain YAML scalar anywhere

    rendered = _render_text(_environment(placeholder, sample=sample), source, variables, limits)
    root = _one_document(rendered, limits)
    pattern = re.compile(f"__asyncrl_{nonce}_(\\d+)__")
    quoted = _quoted_placeholders(root, pattern)
    try:
        document = yaml.SafeLoader("").construct_document(root)
    except yaml.YAMLError as error:  # a tag the safe loader does not construct (!!python/object, ...)
        raise TemplateError(f"agent template does not render valid YAML: {_yaml_reason(error)}") from error
    job = _substitute(document, pattern, values, quoted, path="")
    check_job_structure(job)
    size = len(json.dumps(job))
    if size > limits.max_job_bytes:
        raise TemplateError(
            f"agent template renders a Job of {size} bytes, over the limit of {limits.max_job_bytes}"
        )
    return job  # type: ignore[no-any-return]  # checked to be a mapping


def _render_text(
    environment: ImmutableSandboxedEnvironment,
    source: str,
    variables: Mapping[str, Any],
    limits: RenderLimits,
) -> str:
    """The template's text, stopped as soon as it grows past `limits.max_rendered_chars`."""
    chunks: list[str] = []
    size = 0
    try:
        for chunk in environment.from_string(source).generate(**variables):
            size += len(chunk)
            if size > limits.max_rendered_chars:
                raise TemplateError(
                    f"agent template renders more than {limits.max_rendered_chars} characters "
                    "(the render output limit); is a loop running away?"
                )
            chunks.append(chunk)
    except TemplateError:
        raise
    except jinja2.TemplateSyntaxError as error:
        raise TemplateError(f"agent template line {error.lineno}: {error.message}") from error
    except jinja2.UndefinedError as error:
        raise TemplateError(f"agent template: {error.message}", row_dependent=True) from error
    except jinja2.exceptions.SecurityError as error:
        raise TemplateError(f"agent template: not allowed in the sandbox: {error}") from error
    except MemoryError as error:
        raise TemplateError("agent template ran out of memory while rendering") from error
    except Exception as error:  # a filter or expression failing on this row's data
        raise TemplateError(
            f"agent template failed for this rollout: {type(error).__name__}: {error}"
        ) from error
    return "".join(chunks)


def _one_document(rendered: str, limits: RenderLimits) -> yaml.Node:
    """The rendered text's single YAML document, as nodes (aliases still shared, not yet expanded)."""
    try:
        nodes = [
            node
            for node in yaml.compose_all(rendered, Loader=yaml.SafeLoader)
            if not (isinstance(node, yaml.ScalarNode) and node.tag == YAML_NULL_TAG)
        ]
    except yaml.YAMLError as error:
        raise TemplateError(f"agent template does not render valid YAML: {_yaml_reason(error)}") from error
    except RecursionError as error:
        raise TemplateError("agent template renders YAML nested too deeply") from error
    if len(nodes) != 1:
        raise TemplateError(
            f"agent template must render exactly one document (a batch/v1 Job); got {len(nodes)}"
        )
    _check_expanded_size(nodes[0], limits.max_yaml_nodes)
    return nodes[0]


def _yaml_reason(error: yaml.YAMLError) -> str:
    """`line L column C: <context> <problem>`, without PyYAML's multi-line excerpt of the text."""
    if not isinstance(error, yaml.MarkedYAMLError):
        return str(error)
    mark = error.problem_mark
    where = f"line {mark.line + 1} column {mark.column + 1}: " if mark else ""
    return f"{where}{error.context or ''} {error.problem or ''}".strip()


def _check_expanded_size(root: yaml.Node, limit: int) -> None:
    """Refuse YAML whose aliases expand past `limit` nodes, or refer to themselves (counted without expanding:
    each distinct node's expanded size is computed once)."""
    sizes: dict[int, int] = {}
    in_progress: set[int] = set()
    # Iterative post-order walk: a deep document must not exhaust the stack here either.
    stack: list[tuple[yaml.Node, bool]] = [(root, False)]
    while stack:
        node, children_done = stack.pop()
        key = id(node)
        if children_done:
            in_progress.discard(key)
            sizes[key] = 1 + sum(sizes[id(child)] for child in _children(node))
            if sizes[key] > limit:
                raise TemplateError(
                    f"agent template's YAML expands to more than {limit} nodes (the YAML alias limit); "
                    "use fewer anchors and aliases (*name)"
                )
            continue
        if key in sizes:
            continue
        if key in in_progress:
            raise TemplateError("agent template's YAML has an alias that refers to itself")
        in_progress.add(key)
        stack.append((node, True))
        stack.extend((child, False) for child in _children(node) if id(child) not in sizes)


def _children(node: yaml.Node) -> list[yaml.Node]:
    if isinstance(node, yaml.SequenceNode):
        return list(node.value)
    if isinstance(node, yaml.MappingNode):
        return [item for pair in node.value for item in pair]
    return []


def _quoted_placeholders(root: yaml.Node, pattern: re.Pattern[str]) -> set[int]:
    """Placeholders inside quoted scalars: the author asked for text there (`value: "{{ n }}"`)."""
    quoted: set[int] = set()
    seen: set[int] = set()
    stack = [root]
    while stack:
        node = stack.pop()
        if id(node) in seen:
            continue
        seen.add(id(node))
        if isinstance(node, yaml.ScalarNode):
            if node.style in ('"', "'"):
                quoted.update(int(index) for index in pattern.findall(node.value))
        else:
            stack.extend(_children(node))
    return quoted


def _substitute(
    node: Any, pattern: re.Pattern[str], values: list[Any], quoted: set[int], *, path: str
) -> Any:
    if isinstance(node, dict):
        result: dict[Any, Any] = {}
        for key, value in node.items():
            if isinstance(key, str) and pattern.search(key):
                where = path or "the top level"
                raise TemplateError(
                    f"agent template: a mapping key under {where} comes from a template expression; "
                    "keys are the Job's structure, so write them literally and put {{ ... }} in values"
                )
            result[key] = _substitute(value, pattern, values, quoted, path=_join(path, key))
        return result
    if isinstance(node, list):
        return [
            _substitute(item, pattern, values, quoted, path=f"{path}[{index}]")
            for index, item in enumerate(node)
        ]
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
    return json.dumps(value, sort_keys=True)


def _join(path: str, key: Any) -> str:
    return f"{path}.{key}" if path else str(key)
