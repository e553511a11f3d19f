"""Scalars are read as strictly as the API server reads them: `"yes"` is not a boolean, `"4"` not an integer.

Pydantic's lax mode would coerce both, so local mode ran manifests that `kubectl apply` rejects. The fields
are found from the generated CRD schema, so a field added later is covered without touching this file.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator
from typing import Any

import pytest

from asyncrl.api import InvalidRunError, crd, load_run

SPEC_SCHEMA: dict[str, Any] = crd.openapi_schema()["properties"]["spec"]

REQUIRED_ONLY_SPEC: dict[str, Any] = {
    "model": {"name": "m", "path": "/models/m"},
    "data": {"path": "/data/rows.jsonl"},
    "trainBatchSize": 8,
    "agents": {"template": {"inline": "kind: Job"}},
}

# What the API server's structural schema refuses for each scalar type (YAML already parsed).
NOT_OF_TYPE: dict[str, list[Any]] = {
    "boolean": ["yes", "true", 1, 0],
    "integer": ["4", 4.5, 4.0, True],
    "number": ["2.5", True],
}


def _scalar_paths(
    schema: dict[str, Any], prefix: tuple[str, ...] = ()
) -> Iterator[tuple[tuple[str, ...], str]]:
    for name, child in schema.get("properties", {}).items():
        if child.get("type") in NOT_OF_TYPE:
            yield (*prefix, name), child["type"]
        elif child.get("type") == "object":
            yield from _scalar_paths(child, (*prefix, name))


SCALARS = sorted(_scalar_paths(SPEC_SCHEMA))


def _with(path: tuple[str, ...], value: Any) -> dict[str, Any]:
    spec = copy.deepcopy(REQUIRED_ONLY_SPEC)
    node = spec
    for key in path[:-1]:
        node = node.setdefault(key, {})
    node[path[-1]] = value
    return {
        "apiVersion": "asyncrl.dev/v1alpha1",
        "kind": "AsyncTrainingRun",
        "metadata": {"name": "r"},
        "spec": spec,
    }


def test_the_schema_has_the_scalars_this_test_is_about() -> None:
    found = {".".join(path) for path, _ in SCALARS}
    assert {
        "async.enabled",
        "trainBatchSize",
        "rollout.samplesPerPrompt",
        "suspend",
        "rolloutCorrection.threshold",
    } <= found


@pytest.mark.parametrize(("path", "kind"), SCALARS, ids=[".".join(path) for path, _ in SCALARS])
def test_a_value_of_another_type_is_rejected_at_its_field(path: tuple[str, ...], kind: str) -> None:
    for value in NOT_OF_TYPE[kind]:
        with pytest.raises(InvalidRunError) as raised:
            load_run(_with(path, value))
        messages = [str(error) for error in raised.value.errors]
        field = "spec." + ".".join(path)
        assert any(message.startswith(f"{field}: must be a") for message in messages), (value, messages)


def test_the_message_names_the_field_and_what_was_given() -> None:
    with pytest.raises(InvalidRunError) as raised:
        load_run(_with(("async", "enabled"), "yes"))
    assert [str(error) for error in raised.value.errors] == [
        "spec.async.enabled: must be a boolean (true or false), not the string 'yes'"
    ]


def test_a_number_field_takes_an_integer_as_the_api_server_does() -> None:
    run = load_run(_with(("rolloutCorrection", "threshold"), 3))
    assert run.spec.rollout_correction.threshold == 3.0


def test_unquoted_yaml_booleans_and_integers_still_load() -> None:
    run = load_run(_with(("async",), {"enabled": True, "windowSize": 16}))
    assert run.spec.async_.enabled is True
    assert run.spec.async_.window_size == 16
