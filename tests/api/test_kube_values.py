"""Label keys and values, quantities, the learning rate's type and enum case, refused when a run is loaded
(local mode, the operator, `asyncrl validate`) with the field named: before, each passed and the trainer Job
got a 422 at run time (or the Reference trainer crashed on float('fast'))."""

from __future__ import annotations

import copy
from decimal import Decimal
from typing import Any

import pytest

from asyncrl.api import InvalidRunError, load_run
from asyncrl.api.kube_values import label_key_problem, label_value_problem, parse_quantity

from .conftest import load_example


def _errors(change: dict[str, Any]) -> list[str]:
    manifest = copy.deepcopy(load_example("run-gpu.yaml"))
    for dotted, value in change.items():
        *parents, last = dotted.split("/")
        node = manifest
        for part in parents:
            node = node.setdefault(part, {})
        node[last] = value
    with pytest.raises(InvalidRunError) as raised:
        load_run(manifest)
    return [str(error) for error in raised.value.errors]


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        (
            {"spec/trainer/resources": {"requests": {"cpu": "-1"}}},
            "spec.trainer.resources.requests.cpu: '-1' is negative; a quantity must be 0 or more",
        ),
        (
            {"spec/gateway/resources": {"requests": {"memory": "1Gi"}, "limits": {"memory": "512Mi"}}},
            "spec.gateway.resources.limits.memory: the limit '512Mi' is below the request '1Gi' of memory",
        ),
        (
            {"spec/trainer/podTemplate": {"metadata": {"labels": {"team": "ml team"}}}},
            "spec.trainer.podTemplate.metadata.labels.team: label value 'ml team' must be at most 63",
        ),
        (
            {"spec/trainer/podTemplate": {"nodeSelector": {"gpu type": "h100"}}},
            "spec.trainer.podTemplate.nodeSelector.gpu type: label key 'gpu type': the name 'gpu type'",
        ),
        (
            {"spec/trainer/podTemplate": {"metadata": {"annotations": {"Example.com/x": "y"}}}},
            "spec.trainer.podTemplate.metadata.annotations.Example.com/x: annotation key 'Example.com/x': "
            "the prefix 'Example.com' must be a DNS subdomain",
        ),
        (
            {"spec/trainer/verlOverrides": {"actor_rollout_ref.actor.optim.lr": "fast"}},
            "spec.trainer.verlOverrides: 'actor_rollout_ref.actor.optim.lr' must be a number (e.g. 1.0e-6), "
            "not 'fast'",
        ),
        (
            {"spec/trainer/verlOverrides": {"actor_rollout_ref": {"actor": {"optim": {"lr": "1e-6"}}}}},
            "spec.trainer.verlOverrides: 'actor_rollout_ref.actor.optim.lr' must be a number (e.g. 1.0e-6), "
            "not '1e-6'; YAML 1.1 reads 1e-6 without a dot as text",
        ),
        (
            {"spec/gateway/samplingParams": "enforce"},
            "spec.gateway.samplingParams: Input should be 'Enforce', 'Reject' or 'Allow'; "
            "did you mean 'Enforce'?",
        ),
        (
            {"spec/trainer/sampleLevel": "Trajectroy"},
            "spec.trainer.sampleLevel: Input should be 'Transition' or 'Trajectory'; "
            "did you mean 'Trajectory'?",
        ),
    ],
)
def test_a_value_the_api_server_refuses_only_at_run_time_is_refused_when_loaded(
    change: dict[str, Any], expected: str
) -> None:
    errors = _errors(change)
    assert any(error.startswith(expected) for error in errors), errors


def test_quantities_parse_as_kubernetes_reads_them() -> None:
    assert parse_quantity("500m") == Decimal("0.5")
    assert parse_quantity("64Gi") == 64 * 2**30
    assert parse_quantity("1e3") == 1000
    assert parse_quantity(8) == 8
    assert parse_quantity("1.5G") == Decimal("1.5e9")
    assert parse_quantity("-1") == -1
    assert parse_quantity("lots") is None
    assert parse_quantity(True) is None


@pytest.mark.parametrize("key", ["team", "app.kubernetes.io/part-of", "kueue.x-k8s.io/queue-name", "a_b.c-d"])
def test_valid_label_keys_pass(key: str) -> None:
    assert label_key_problem(key) is None


@pytest.mark.parametrize("key", ["", "-team", "team-", "a b", "/x", "Example.com/x", "x/" + "a" * 64])
def test_invalid_label_keys_are_named(key: str) -> None:
    assert label_key_problem(key) is not None


@pytest.mark.parametrize(
    ("value", "valid"), [("", True), ("v1.2_3-a", True), ("a b", False), ("x" * 64, False)]
)
def test_label_values(value: str, valid: bool) -> None:
    assert (label_value_problem(value) is None) is valid
