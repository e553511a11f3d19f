"""Agent templates render safely: dataset text can never inject YAML or template code."""

from __future__ import annotations

import pytest

from asyncrl.agent_templates.render import TemplateError, render_job, template_variables

TEMPLATE = """
apiVersion: batch/v1
kind: Job
metadata:
  name: {{ job_name }}
spec:
  template:
    spec:
      containers:
      - name: agent
        image: python:3.11
        command: ["python", "-m", "agent", "--question={{ input.question }}"]
        env:
        - name: QUESTION
          value: {{ input.question }}
        - name: ATTEMPTS
          value: "{{ input.attempts }}"
        - name: LIMIT
          value: limit={{ input.limit }}
      terminationGracePeriodSeconds: {{ input.limit }}
"""


def _render(row: dict[str, object]) -> dict[str, object]:
    return render_job(TEMPLATE, {"input": row, "job_name": "run-r-1", "rollout": {"id": "r1"}})


def _env(job: dict[str, object]) -> dict[str, object]:
    container = job["spec"]["template"]["spec"]["containers"][0]  # type: ignore[index]
    return {entry["name"]: entry["value"] for entry in container["env"]}


def test_values_fill_whole_scalars_with_their_type_and_parts_of_strings_as_text() -> None:
    job = _render({"question": "what is 2+2?", "attempts": 3, "limit": 7})
    assert _env(job) == {"QUESTION": "what is 2+2?", "ATTEMPTS": "3", "LIMIT": "limit=7"}
    assert job["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] == 7  # type: ignore[index]
    command = job["spec"]["template"]["spec"]["containers"][0]["command"]  # type: ignore[index]
    assert command[-1] == "--question=what is 2+2?"
    assert job["metadata"]["name"] == "run-r-1"  # type: ignore[index]


@pytest.mark.parametrize(
    "hostile",
    [
        'x"\n        - name: INJECTED\n          value: "yes',
        "x\n---\napiVersion: v1\nkind: Pod",
        "{{ 7 * 7 }} {% raw %}",
        "}}{{ job_name }}",
        "key: value, other: [1, 2]",
        "'; rm -rf / #",
    ],
)
def test_dataset_text_stays_inside_its_scalar(hostile: str) -> None:
    job = _render({"question": hostile, "attempts": 1, "limit": 1})
    env = _env(job)
    assert env["QUESTION"] == hostile
    assert set(env) == {"QUESTION", "ATTEMPTS", "LIMIT"}
    command = job["spec"]["template"]["spec"]["containers"][0]["command"]  # type: ignore[index]
    assert command[-1] == f"--question={hostile}"


def test_missing_input_field_is_a_clear_error() -> None:
    with pytest.raises(TemplateError, match="'dict object' has no attribute 'question'"):
        _render({"attempts": 1, "limit": 1})


def test_sandbox_blocks_python_internals() -> None:
    source = TEMPLATE.replace("{{ job_name }}", "{{ input.__class__.__mro__ }}")
    with pytest.raises(TemplateError, match=r"__class__"):
        render_job(source, {"input": {"question": "q", "attempts": 1, "limit": 1}, "job_name": "j"})


@pytest.mark.parametrize(
    ("source", "message"),
    [
        ("apiVersion: v1\nkind: Pod\nmetadata: {name: x}\n", "must render a batch/v1 Job; got v1/Pod"),
        ("apiVersion: batch/v1\nkind: Job\n---\napiVersion: batch/v1\nkind: Job\n", "exactly one document"),
        (
            "apiVersion: batch/v1\nkind: Job\nspec: {template: {spec: {}}}\n",
            "spec.template.spec.containers: expected a non-empty list of containers",
        ),
        ("apiVersion: batch/v1\nkind: Job\n  bad: indentation\n", "valid YAML"),
    ],
)
def test_templates_that_do_not_render_one_job_are_rejected(source: str, message: str) -> None:
    with pytest.raises(TemplateError, match=message):
        render_job(source, {})


def test_row_fields_are_variables_and_tojson_does_not_double_quote() -> None:
    source = TEMPLATE.replace("{{ input.question }}", "{{ question | tojson }}")
    variables = template_variables(
        {"question": 'say "hi"', "attempts": 2, "limit": 1, "job_name": "from-row"},
        rollout={"id": "r1"},
        job_name="run-r-1",
        run={"name": "run", "namespace": "ns"},
    )
    job = render_job(source, variables)
    assert _env(job)["QUESTION"] == 'say "hi"'
    assert job["metadata"]["name"] == "run-r-1"  # type: ignore[index]  # ours win over row fields


def test_syntax_errors_name_the_line() -> None:
    with pytest.raises(TemplateError, match="line 2"):
        render_job("apiVersion: batch/v1\nkind: {{ Job\n", {})
