"""Template typos give one line naming the path of the first wrong field, never an uncaught exception."""

from __future__ import annotations

from typing import Any

import pytest

from asyncrl.agent_templates.render import TemplateError, render_job

HEAD = "apiVersion: batch/v1\nkind: Job\n"


def _job(pod_spec: str) -> str:
    """A template whose pod spec is `pod_spec` (YAML, indented for its place)."""
    return HEAD + "spec:\n  template:\n    spec:\n" + pod_spec


AGENT = "      containers:\n      - name: agent\n        image: python:3.12\n"


@pytest.mark.parametrize(
    ("source", "variables", "message"),
    [
        (
            _job("      containers: [agent]\n"),
            {},
            "spec.template.spec.containers[0]: expected a mapping with name and image, "
            "got the string 'agent'",
        ),
        (HEAD + "spec: oops\n", {}, "spec: expected a mapping, got the string 'oops'"),
        (
            _job(AGENT + "        env: [X]\n"),
            {},
            "spec.template.spec.containers[0].env[0]: expected a mapping with a name "
            "(and a value or valueFrom), got the string 'X'",
        ),
        (
            _job(AGENT + "        env:\n        - {{ key }}: value\n"),
            {"key": "name"},
            "a mapping key under spec.template.spec.containers[0].env[0] comes from a template expression",
        ),
        (
            _job(AGENT + "        env:\n        - name: X\n          {{ key }}: 1\n"),
            {"key": {"a": 1}},  # a mapping as a key was an uncaught TypeError (unhashable)
            "a mapping key under spec.template.spec.containers[0].env[0] comes from a template expression",
        ),
        (_job("      containers: []\n"), {}, "spec.template.spec.containers: expected a non-empty list"),
        (
            _job("      containers:\n      - name: agent\n"),
            {},
            "containers[0].image: expected a non-empty string",
        ),
        (
            _job("      containers:\n      - image: python\n"),
            {},
            "containers[0].name: expected a non-empty string",
        ),
        (_job(AGENT + "        env:\n        - value: x\n"), {}, "env[0].name: expected a non-empty string"),
        (
            _job(AGENT + "        env:\n        - name: N\n          value: {{ n }}\n"),
            {"n": 7},
            'env[0].value: expected a string; quote the value (value: "{{ n }}")',
        ),
        (
            _job(AGENT + "        command: python -m agent\n"),
            {},
            "containers[0].command: expected a list, got",
        ),
        (_job(AGENT + "        args: [--n, 3]\n"), {}, "containers[0].args[1]: expected a string"),
        (
            _job(AGENT + "        resources: {limits: {cpu: [1]}}\n"),
            {},
            "containers[0].resources.limits.cpu: expected a quantity",
        ),
        (HEAD + "spec:\n  template: []\n", {}, "spec.template: expected a mapping, got a list"),
        (
            HEAD + "spec:\n  template:\n    spec: null\n",
            {},
            "spec.template.spec: expected a mapping, got nothing",
        ),
        (
            HEAD + "metadata:\n  labels: {team: 7}\n" + "spec:\n  template:\n    spec:\n" + AGENT,
            {},
            "metadata.labels.team: expected a string",
        ),
        (
            _job(AGENT + "      volumes: [data]\n"),
            {},
            "spec.template.spec.volumes[0]: expected a mapping with a name",
        ),
        (_job(AGENT + "      1: x\n"), {}, "spec.template.spec: the key 1 is not a string"),
        (
            _job(AGENT + "        workingDir: 2024-01-01\n"),
            {},
            "containers[0].workingDir: expected JSON data",
        ),
        (_job(AGENT + "      initContainers: [{name: init}]\n"), {}, "initContainers[0].image: expected"),
        ("- apiVersion: batch/v1\n", {}, "must render a batch/v1 Job; got a list"),
        (
            _job("      containers: !!python/object/apply:os.system [id]\n"),
            {},
            "does not render valid YAML: line 6 column 19: could not determine a constructor for the tag",
        ),
    ],
)
def test_a_typo_is_one_line_naming_the_path(source: str, variables: dict[str, Any], message: str) -> None:
    with pytest.raises(TemplateError) as raised:
        render_job(source, variables)
    assert message in str(raised.value)
    assert "\n" not in str(raised.value)


def test_a_valid_job_passes_with_optional_fields() -> None:
    source = _job(
        AGENT
        + "        command: [python, -m, agent]\n"
        + "        env:\n        - name: A\n          value: '1'\n        - name: B\n"
        + "          valueFrom: {fieldRef: {fieldPath: metadata.name}}\n"
        + "        resources: {limits: {cpu: 1, memory: 1Gi}}\n"
        + "        volumeMounts: [{name: scratch, mountPath: /scratch}]\n"
        + "      volumes: [{name: scratch, emptyDir: {}}]\n"
    )
    job = render_job(source, {})
    assert job["spec"]["template"]["spec"]["volumes"] == [{"name": "scratch", "emptyDir": {}}]


def test_yaml_errors_are_one_line_with_the_position() -> None:
    with pytest.raises(TemplateError) as raised:
        render_job(HEAD + "spec:\n  template:\n    spec: {containers: [\n", {})
    assert str(raised.value).startswith("agent template does not render valid YAML: line ")
    assert "\n" not in str(raised.value)


def test_deeply_nested_yaml_is_refused() -> None:
    with pytest.raises(TemplateError, match="nested too deeply"):
        render_job(HEAD + "x: " + "[" * 5000 + "]" * 5000 + "\n", {})
