"""Local mode reads a manifest as the API server does: same wire names, same defaults, same rejections."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from asyncrl.api import AsyncTrainingRunSpec, InvalidRunError, check_update, crd, load_run
from asyncrl.api.types import TrainerBackend
from asyncrl.api.types.tool_call_parsers import TOOL_CALL_PARSER_VALUES
from asyncrl.trainer.window import StalenessPolicy, WindowConfig

from .conftest import load_example

SPEC_SCHEMA: dict[str, Any] = crd.openapi_schema()["properties"]["spec"]

REQUIRED_ONLY_SPEC: dict[str, Any] = {
    "model": {"name": "m", "path": "/models/m"},
    "data": {"path": "/data/rows.jsonl"},
    "trainBatchSize": 8,
    "agents": {"template": {"inline": "kind: Job"}},
}


def _default_like_the_api_server(schema: dict[str, Any], value: Any) -> Any:
    """Structural-schema defaulting: fill absent properties' defaults, then default inside them."""
    if schema["type"] == "object" and isinstance(value, dict):
        for name, child in schema.get("properties", {}).items():
            if name not in value and "default" in child:
                value[name] = copy.deepcopy(child["default"])
            if name in value:
                value[name] = _default_like_the_api_server(child, value[name])
    elif schema["type"] == "array" and isinstance(value, list):
        return [_default_like_the_api_server(schema["items"], item) for item in value]
    return value


def _manifest(spec: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": "asyncrl.dev/v1alpha1",
        "kind": "AsyncTrainingRun",
        "metadata": {"name": "r"},
        "spec": spec,
    }


def _errors(manifest: dict[str, Any]) -> list[str]:
    with pytest.raises(InvalidRunError) as raised:
        load_run(manifest)
    return [str(error) for error in raised.value.errors]


def test_minimal_example_loads_and_configures_the_window() -> None:
    run = load_run(load_example("run-minimal.yaml"))

    assert run.name == "minimal"
    assert run.spec.trainer.backend is TrainerBackend.REFERENCE
    assert run.spec.window_config() == WindowConfig(
        train_batch_size=2,
        samples_per_prompt=2,
        async_enabled=True,
        async_window_size=4,
        max_carry_over_age_steps=None,
        staleness_policy=StalenessPolicy.CANCEL,
        refill_during_collection=True,  # the spec's default: the manifest does not name it
    )


def test_the_window_takes_every_default_from_the_spec() -> None:
    """One default per field: `AsyncSpec` holds them; the window's settings have none of their own."""
    assert [name for name, field in WindowConfig.model_fields.items() if not field.is_required()] == []


def test_invalid_example_is_rejected_with_the_2x_advice_at_the_field() -> None:
    assert _errors(load_example("run-invalid-async.yaml")) == [
        "spec.async.windowSize: windowSize (2) must be greater than trainBatchSize (2) "
        "when async is enabled; try windowSize: 4 (2 x trainBatchSize)"
    ]


@given(train=st.integers(1, 100_000), window=st.integers(1, 200_000))
def test_async_window_is_valid_exactly_when_it_exceeds_the_train_batch(train: int, window: int) -> None:
    spec = {
        **REQUIRED_ONLY_SPEC,
        "trainBatchSize": train,
        "async": {"enabled": True, "windowSize": window},
    }
    if window > train:
        assert load_run(_manifest(spec)).spec.window_config().window_size == window
    else:
        with pytest.raises(InvalidRunError, match=rf"try windowSize: {2 * train} \(2 x trainBatchSize\)"):
            load_run(_manifest(spec))


def test_sync_mode_needs_no_window_size() -> None:
    run = load_run(_manifest(REQUIRED_ONLY_SPEC))
    assert run.spec.window_config().window_size == 8
    assert run.spec.async_.enabled is False


@pytest.mark.parametrize(
    "spec",
    [
        REQUIRED_ONLY_SPEC,
        {
            **REQUIRED_ONLY_SPEC,
            "data": {"configMapRef": {"name": "rows", "key": "rows.jsonl"}},
            "gateway": {"keySecretRef": {"name": "gateway-key"}},
            "trainer": {"checkpoint": {"claimName": "ckpt"}},
            "logging": {"wandb": {"apiKeySecretRef": {"name": "wandb", "key": "api-key"}}},
            "async": {"enabled": True, "windowSize": 16},
        },
    ],
    ids=["required-only", "optional-objects"],
)
def test_pydantic_defaults_are_the_crd_defaults(spec: dict[str, Any]) -> None:
    defaulted_by_crd = _default_like_the_api_server(SPEC_SCHEMA, copy.deepcopy(spec))
    assert load_run(_manifest(spec)).spec.to_wire() == defaulted_by_crd


def test_documented_defaults() -> None:
    spec = load_run(_manifest(REQUIRED_ONLY_SPEC)).spec
    assert spec.to_wire() == {
        **REQUIRED_ONLY_SPEC,
        "model": {"name": "m", "path": "/models/m", "toolCallParser": "hermes"},
        "data": {
            "path": "/data/rows.jsonl",
            "shuffle": True,
            "seed": 0,
            "maxPromptLength": 4096,
            "maxResponseLength": 4096,
        },
        "rollout": {"samplesPerPrompt": 4, "dropUniformGroups": False},
        "rolloutTimeoutSeconds": 1800,
        "maxFailedSteps": 3,
        "async": {"enabled": False, "refillDuringCollection": True, "stalenessPolicy": "Cancel"},
        "rolloutCorrection": {"mode": "Token", "threshold": 2.0},
        "trainer": {
            "backend": "Verl",
            "image": "ghcr.io/asyncrl/trainer:0.1.0",
            "gpus": 1,
            "nodes": 1,
            "checkpoint": {"everySteps": 10},
            "failedRolloutReward": 0.0,
            "sampleLevel": "Trajectory",
        },
        "gateway": {
            "image": "ghcr.io/asyncrl/gateway:0.1.0",
            "port": 8090,
            "pauseMode": "Hold",
            "drainPolicy": "Abort",
            "holdTimeoutSeconds": 900,
            "maxHeldCalls": 10000,
            "retryAfterSeconds": 5,
            "samplingParams": "Enforce",
            "resources": {"requests": {"cpu": "500m", "memory": "512Mi"}},
            "capture": "Compact",
            "maxCaptureBytes": 1024**3,
            "maxCaptureBytesPerRollout": 64 * 1024**2,
        },
        "agents": {
            "mode": "Jobs",
            "pool": {"replicas": 4},
            "template": {"inline": "kind: Job"},
            "maxJobsPerMinute": 100,
            "ttlSecondsAfterFinished": 1200,
        },
        "logging": {"wandb": {"mode": "Offline"}},
        "suspend": False,
    }


def test_errors_name_each_failing_field_by_its_wire_path() -> None:
    spec = copy.deepcopy(REQUIRED_ONLY_SPEC)
    spec["data"] = {"inline": [{"q": "1"}, "not an object"]}
    spec["gateway"] = {"port": 0, "agentURL": "gateway:8090"}
    spec["trainer"] = {"backend": "torch"}

    errors = _errors(_manifest(spec))

    assert [error.split(":")[0] for error in errors] == [
        "spec.data.inline[1]",
        "spec.trainer.backend",
        "spec.gateway.port",
        "spec.gateway.agentURL",
    ]


@pytest.mark.parametrize(
    ("data", "given_sources"),
    [({"shuffle": False}, "none"), ({"path": "/rows.jsonl", "inline": [{"q": "1"}]}, "inline, path")],
)
def test_data_needs_exactly_one_source(data: dict[str, Any], given_sources: str) -> None:
    assert _errors(_manifest({**REQUIRED_ONLY_SPEC, "data": data})) == [
        f"spec.data: data needs exactly one of inline, configMapRef or path (given: {given_sources})"
    ]


def test_agent_template_needs_exactly_one_source() -> None:
    spec = {**REQUIRED_ONLY_SPEC, "agents": {"template": {}}}
    assert _errors(_manifest(spec)) == [
        "spec.agents.template: agents.template needs exactly one of configMapRef or inline (given: none)"
    ]


def test_api_version_and_kind_are_checked() -> None:
    manifest = {**_manifest(REQUIRED_ONLY_SPEC), "apiVersion": "asyncrl.dev/v1", "kind": "TrainingRun"}
    assert _errors(manifest) == [
        "apiVersion: expected asyncrl.dev/v1alpha1, got 'asyncrl.dev/v1'",
        "kind: expected AsyncTrainingRun, got 'TrainingRun'",
    ]


def test_manifests_use_wire_names_only() -> None:
    spec = {**REQUIRED_ONLY_SPEC, "train_batch_size": 8, "typo": 1}
    assert _errors(_manifest(spec)) == [
        "spec.train_batch_size: unknown field; did you mean trainBatchSize?",
        "spec.typo: unknown field; the fields here are " + ", ".join(sorted(_spec_fields())),
    ]


def _spec_fields() -> list[str]:
    return [field.alias or name for name, field in AsyncTrainingRunSpec.model_fields.items()]


def test_an_unknown_field_is_told_the_closest_known_name_at_its_level() -> None:
    spec = {**REQUIRED_ONLY_SPEC, "rollout": {"samplesPerPromt": 4}, "data": {"path": "/d", "shufle": False}}
    assert _errors(_manifest(spec)) == [
        "spec.data.shufle: unknown field; did you mean shuffle?",
        "spec.rollout.samplesPerPromt: unknown field; did you mean samplesPerPrompt?",
    ]


@pytest.mark.parametrize("parser", ["hermes", "llama3_json", "granite-20b-fc", "Disabled"])
def test_a_tool_call_parser_vllm_knows_or_disabled_is_accepted(parser: str) -> None:
    spec = {**REQUIRED_ONLY_SPEC, "model": {"name": "m", "path": "/m", "toolCallParser": parser}}
    assert load_run(_manifest(spec)).spec.model.tool_call_parser == parser


def test_a_misspelt_tool_call_parser_is_refused_with_the_nearest_name() -> None:
    spec = {**REQUIRED_ONLY_SPEC, "model": {"name": "m", "path": "/m", "toolCallParser": "hermse"}}
    (error,) = _errors(_manifest(spec))
    assert error.startswith("spec.model.toolCallParser: ")
    assert "'hermse' is not one of vLLM 0.24's tool-call parsers; did you mean 'hermes'?" in error


def test_the_crd_lists_the_tool_call_parsers_the_api_accepts() -> None:
    schema = SPEC_SCHEMA["properties"]["model"]["properties"]["toolCallParser"]
    assert schema["enum"] == list(TOOL_CALL_PARSER_VALUES)
    assert schema["default"] == "hermes"


def test_python_code_may_use_snake_case_names() -> None:
    spec = AsyncTrainingRunSpec.model_validate(
        {
            "model": {"name": "m", "path": "p"},
            "data": {"path": "/rows.jsonl"},
            "train_batch_size": 2,
            "async_": {"enabled": True, "window_size": 4, "staleness_policy": "Keep"},
            "agents": {"template": {"config_map_ref": {"name": "t", "key": "job"}}},
        }
    )
    assert spec.async_.staleness_policy is StalenessPolicy.KEEP
    assert spec.to_wire()["async"]["windowSize"] == 4


def test_changing_what_a_run_trains_is_rejected_like_the_transition_rules() -> None:
    old = load_run(load_example("run-minimal.yaml")).spec
    new = old.model_copy(update={"train_batch_size": 3, "suspend": True})

    with pytest.raises(InvalidRunError) as raised:
        check_update(old, new)

    assert [str(error) for error in raised.value.errors] == [
        "spec.trainBatchSize: trainBatchSize cannot change after the run is created; "
        "create a new AsyncTrainingRun instead"
    ]


def test_changing_suspend_is_allowed() -> None:
    old = load_run(load_example("run-minimal.yaml")).spec
    check_update(old, old.model_copy(update={"suspend": True}))


def test_spec_wire_names() -> None:
    fields = {field.alias or name for name, field in AsyncTrainingRunSpec.model_fields.items()}
    assert fields == {
        "model",
        "data",
        "trainBatchSize",
        "rollout",
        "rolloutTimeoutSeconds",
        "totalSteps",
        "maxFailedSteps",
        "async",
        "rolloutCorrection",
        "trainer",
        "gateway",
        "agents",
        "logging",
        "suspend",
    }


@pytest.mark.parametrize(
    ("old", "new"),
    [
        (("rollout", "n"), "spec.rollout.samplesPerPrompt"),
        (("async", "asyncTrainBatchSize"), "spec.async.windowSize"),
        (("trainer", "level"), "spec.trainer.sampleLevel"),
        (("trainer", "fillReward"), "spec.trainer.failedRolloutReward"),
    ],
)
def test_a_field_renamed_before_the_release_names_its_new_name(old: tuple[str, str], new: str) -> None:
    manifest = _manifest(copy.deepcopy(REQUIRED_ONLY_SPEC))
    manifest["spec"].setdefault(old[0], {})[old[1]] = 4
    with pytest.raises(InvalidRunError) as raised:
        load_run(manifest)
    assert f"spec.{'.'.join(old)}: renamed to {new} (CHANGELOG.md)" in str(raised.value)


@pytest.mark.parametrize("key", [False, True, "false"])
def test_a_key_yaml_read_as_a_boolean_is_named_with_the_fix(key: object) -> None:
    manifest = _manifest(copy.deepcopy(REQUIRED_ONLY_SPEC))
    manifest["spec"]["rollout"] = {key: 4}
    with pytest.raises(InvalidRunError) as raised:
        load_run(manifest)
    message = str(raised.value)
    assert "spec.rollout: the key" in message
    assert "how YAML 1.1 reads a bare y, n, yes, no, on or off" in message
    assert "rename it (rollout.samplesPerPrompt) or quote it" in message


@pytest.mark.parametrize(
    ("port", "taken"),
    [
        (8090, False),
        (6379, True),
        (8080, True),
        (8265, True),
        (10000, False),
        (10001, True),
        (19999, True),
        (20000, False),
        (52365, True),
        (52366, False),
    ],
)
def test_a_multi_node_gateway_port_is_refused_exactly_on_rays_head_ports(port: int, taken: bool) -> None:
    spec = copy.deepcopy(REQUIRED_ONLY_SPEC)
    spec["trainer"] = {"backend": "Verl", "nodes": 2, "checkpoint": {"claimName": "shared"}}
    spec["gateway"] = {"port": port}
    if taken:
        with pytest.raises(InvalidRunError, match=r"spec\.gateway\.port: .*pick another gateway\.port"):
            load_run(_manifest(spec))
    else:
        assert load_run(_manifest(spec)).spec.gateway.port == port
    spec["trainer"]["nodes"] = 1  # one node: no Ray in the pod, every port is the gateway's to take
    assert load_run(_manifest(spec)).spec.gateway.port == port
