"""The generated CRD in a real kube-apiserver: admission, defaulting, CEL rules, printer columns, status.

Everything here is the API server's own behaviour; the CRD under test is the committed YAML.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

import pytest

from asyncrl.api import AsyncTrainingRunStatus, InvalidRunError, Phase, load_run
from asyncrl.api.types import GROUP, PLURAL, VERSION, JobCounts, RolloutCounts
from asyncrl.window_summary import WindowSummary
from tests.support.kube import apply_run, kubectl_run, run_object

from .conftest import EXAMPLES, load_example

pytestmark = [pytest.mark.controlplane, pytest.mark.usefixtures("installed_crd")]


def _custom(api_client: Any) -> Any:
    from kubernetes import client

    return client.CustomObjectsApi(api_client)


def _server_verdict(api_client: Any, namespace: str, manifest: dict[str, Any]) -> str | None:
    """None when a dry-run create is admitted, else the server's message."""
    from kubernetes.client.exceptions import ApiException

    try:
        _custom(api_client).create_namespaced_custom_object(
            GROUP, VERSION, namespace, PLURAL, manifest, dry_run="All"
        )
    except ApiException as error:
        if error.status != 422:
            raise
        return str(json.loads(error.body)["message"])
    return None


def _local_verdict(manifest: dict[str, Any]) -> str | None:
    try:
        load_run(manifest)
    except InvalidRunError as error:
        return str(error)
    return None


def test_the_crd_is_established_with_its_names(api_client: Any, kubectl: list[str]) -> None:
    out = kubectl_run(kubectl, "api-resources", "--api-group", GROUP, "-o", "wide")
    assert out.returncode == 0, out.stderr
    line = next(line for line in out.stdout.splitlines() if line.startswith(PLURAL))
    assert "atr" in line.split()
    assert "AsyncTrainingRun" in line.split()
    assert "asyncrl" in line  # category


def test_minimal_example_is_accepted_and_the_server_fills_the_defaults(
    api_client: Any, kubectl: list[str], namespace: str
) -> None:
    out = kubectl_run(kubectl, "apply", "-n", namespace, "-f", str(EXAMPLES / "run-minimal.yaml"))
    assert out.returncode == 0, out.stderr

    stored = run_object(api_client, namespace, "minimal")["spec"]

    assert stored["rolloutTimeoutSeconds"] == 1800
    assert stored["gateway"] == {
        "image": "ghcr.io/asyncrl/gateway:0.1.0",
        "port": 8090,
        "retryAfterSeconds": 5,
        "samplingParams": "Enforce",
        "pauseMode": "Hold",
        "drainPolicy": "Abort",
        "holdTimeoutSeconds": 900,
        "maxHeldCalls": 10000,
        "capture": "Compact",
        "maxCaptureBytes": 1073741824,
        "maxCaptureBytesPerRollout": 67108864,
        "resources": {"requests": {"cpu": "500m", "memory": "512Mi"}},
    }
    assert stored["logging"] == {"wandb": {"mode": "Offline"}}
    assert stored["async"]["stalenessPolicy"] == "Cancel"
    assert stored["async"]["refillDuringCollection"] is True
    # Every default the server filled is the one pydantic fills, and nothing else differs.
    assert stored == load_run(load_example("run-minimal.yaml")).spec.to_wire()


def test_async_window_not_above_train_batch_is_rejected_with_the_2x_advice(
    kubectl: list[str], namespace: str
) -> None:
    out = kubectl_run(kubectl, "apply", "-n", namespace, "-f", str(EXAMPLES / "run-invalid-async.yaml"))

    assert out.returncode != 0
    assert "spec.async.windowSize" in out.stderr
    advice = (
        "windowSize (2) must be greater than trainBatchSize (2) when async is enabled; "
        "try windowSize: 4 (2 x trainBatchSize)"
    )
    assert advice in out.stderr
    # Local mode says the same.
    with pytest.raises(InvalidRunError, match=r"try windowSize: 4 \(2 x trainBatchSize\)"):
        load_run(load_example("run-invalid-async.yaml"))


def test_async_enabled_without_a_window_size_is_rejected(
    kubectl: list[str], namespace: str, minimal_manifest: dict[str, Any]
) -> None:
    del minimal_manifest["spec"]["async"]["windowSize"]

    out = apply_run(kubectl, namespace, minimal_manifest)

    assert out.returncode != 0
    assert "windowSize (unset) must be greater than trainBatchSize (2)" in out.stderr
    assert "try windowSize: 4" in out.stderr


@pytest.mark.parametrize(
    ("data", "expected"),
    [
        ({"shuffle": True}, "data needs exactly one of inline, configMapRef or path"),
        (
            {"inline": [{"q": "1"}], "path": "/data/rows.jsonl"},
            "data needs exactly one of inline, configMapRef or path",
        ),
    ],
    ids=["no-source", "two-sources"],
)
def test_data_needs_exactly_one_source(
    kubectl: list[str], namespace: str, minimal_manifest: dict[str, Any], data: dict[str, Any], expected: str
) -> None:
    minimal_manifest["spec"]["data"] = data

    out = apply_run(kubectl, namespace, minimal_manifest)

    assert out.returncode != 0
    assert f"spec.data: Invalid value: {expected}" in out.stderr


def test_a_spec_without_data_is_rejected(
    kubectl: list[str], namespace: str, minimal_manifest: dict[str, Any]
) -> None:
    del minimal_manifest["spec"]["data"]

    out = apply_run(kubectl, namespace, minimal_manifest)

    assert out.returncode != 0
    assert "spec.data: Required value" in out.stderr


def test_agent_template_needs_exactly_one_source(
    kubectl: list[str], namespace: str, minimal_manifest: dict[str, Any]
) -> None:
    minimal_manifest["spec"]["agents"]["template"]["configMapRef"] = {"name": "agent", "key": "job.yaml.j2"}

    out = apply_run(kubectl, namespace, minimal_manifest)

    assert out.returncode != 0
    assert "agents.template needs exactly one of configMapRef or inline" in out.stderr


@pytest.mark.parametrize(
    ("patch", "field"),
    [
        ({"spec": {"trainBatchSize": 3}}, "trainBatchSize"),
        ({"spec": {"model": {"name": "other"}}}, "model"),
        ({"spec": {"rollout": {"samplesPerPrompt": 8}}}, "rollout.samplesPerPrompt"),
        ({"spec": {"trainer": {"backend": "Verl"}}}, "trainer.backend"),
        ({"spec": {"async": {"enabled": False}}}, "async.enabled"),
        ({"spec": {"async": {"windowSize": 6}}}, "async.windowSize"),
        ({"spec": {"trainer": {"nodes": 2}}}, "trainer.nodes"),
        # What the trainer and the gateway read once, at their pod's start (issue 25: no silent edits):
        ({"spec": {"totalSteps": 7}}, "totalSteps"),
        ({"spec": {"data": {"shuffle": False}}}, "data"),
        ({"spec": {"rolloutTimeoutSeconds": 99}}, "rolloutTimeoutSeconds"),
        ({"spec": {"maxFailedSteps": 9}}, "maxFailedSteps"),
        ({"spec": {"async": {"maxCarryOverAgeSteps": 2}}}, "async"),
        ({"spec": {"rolloutCorrection": {"mode": "Disabled"}}}, "rolloutCorrection"),
        ({"spec": {"trainer": {"image": "other:1"}}}, "trainer"),
        ({"spec": {"gateway": {"holdTimeoutSeconds": 77}}}, "gateway"),
        ({"spec": {"logging": {"wandb": {"project": "other"}}}}, "logging"),
    ],
    ids=lambda value: value if isinstance(value, str) else "",
)
def test_changing_what_a_run_trains_is_rejected(
    kubectl: list[str], namespace: str, patch: dict[str, Any], field: str
) -> None:
    created = kubectl_run(kubectl, "apply", "-n", namespace, "-f", str(EXAMPLES / "run-minimal.yaml"))
    assert created.returncode == 0, created.stderr

    out = kubectl_run(
        kubectl, "patch", "-n", namespace, "atr", "minimal", "--type=merge", "-p", json.dumps(patch)
    )

    assert out.returncode != 0
    assert f"spec.{field}: Invalid value" in out.stderr
    assert (
        f"{field} cannot change after the run is created; create a new AsyncTrainingRun instead" in out.stderr
    )


def test_changing_suspend_and_other_mutable_fields_is_accepted(
    api_client: Any, kubectl: list[str], namespace: str
) -> None:
    created = kubectl_run(kubectl, "apply", "-n", namespace, "-f", str(EXAMPLES / "run-minimal.yaml"))
    assert created.returncode == 0, created.stderr
    patch = {
        "spec": {
            "suspend": True,
            "agents": {"maxJobsPerMinute": 10, "maxActiveJobs": 3, "ttlSecondsAfterFinished": 5},
        }
    }

    out = kubectl_run(
        kubectl, "patch", "-n", namespace, "atr", "minimal", "--type=merge", "-p", json.dumps(patch)
    )

    assert out.returncode == 0, out.stderr
    spec = run_object(api_client, namespace, "minimal")["spec"]
    assert spec["suspend"] is True
    assert spec["agents"]["maxJobsPerMinute"] == 10
    assert spec["agents"]["maxActiveJobs"] == 3
    assert spec["agents"]["ttlSecondsAfterFinished"] == 5


def _columns(table: str) -> list[str]:
    return table.splitlines()[0].split()


def test_kubectl_get_shows_the_printer_columns(kubectl: list[str], namespace: str) -> None:
    created = kubectl_run(kubectl, "apply", "-n", namespace, "-f", str(EXAMPLES / "run-minimal.yaml"))
    assert created.returncode == 0, created.stderr

    plain = kubectl_run(kubectl, "get", "atr", "-n", namespace)
    wide = kubectl_run(kubectl, "get", "atr", "-n", namespace, "-o", "wide")

    assert plain.returncode == 0, plain.stderr
    assert _columns(plain.stdout) == [
        "NAME",
        "PHASE",
        "STEPS",
        "REWARD",
        "ACTIVE",
        "CARRY-OVER",
        "MAX-AGE",
        "DRAIN",
        "AGE",
    ]
    assert plain.stdout.splitlines()[1].split()[0] == "minimal"
    assert wide.returncode == 0, wide.stderr
    assert _columns(wide.stdout) == [
        "NAME",
        "PHASE",
        "STEPS",
        "REWARD",
        "BEST",
        "ACTIVE",
        "CARRY-OVER",
        "MAX-AGE",
        "DRAIN",
        "SUCCEEDED",
        "FAILED",
        "JOBS",
        "AGE",
    ]


def test_status_is_written_through_the_status_subresource_and_shown_bykubectl_run(
    api_client: Any, kubectl: list[str], namespace: str
) -> None:
    created = kubectl_run(kubectl, "apply", "-n", namespace, "-f", str(EXAMPLES / "run-minimal.yaml"))
    assert created.returncode == 0, created.stderr
    now = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)
    status = AsyncTrainingRunStatus(
        phase=Phase.RUNNING,
        observed_generation=1,
        rollouts=RolloutCounts(succeeded=40, failed=3, running=5),
        jobs=JobCounts(active=7, created=48),
        start_time=now,
    ).with_window_summary(
        WindowSummary(
            step=3,
            prev_carry_over_rollouts=6,
            completed_rollouts=4,
            new_carry_over_rollouts=2,
            carry_over_age_max_steps=2,
            proxy_inflight_at_pause=1,
            proxy_drain_seconds=0.75,
            carry_over_age_histogram={"1": 1, "2": 1},
            active_groups=4,
            reward_mean=0.5,
            total_steps=10,
        ),
        now=now,
    )

    _custom(api_client).patch_namespaced_custom_object_status(
        GROUP, VERSION, namespace, PLURAL, "minimal", {"status": status.to_wire()}
    )
    # The main resource ignores status: only the subresource writes it.
    _custom(api_client).patch_namespaced_custom_object(
        GROUP, VERSION, namespace, PLURAL, "minimal", {"status": {"phase": "Failed"}}
    )

    stored = run_object(api_client, namespace, "minimal")
    assert load_run(stored).status == status
    wide = kubectl_run(kubectl, "get", "atr", "minimal", "-n", namespace, "-o", "wide", "--no-headers")
    assert wide.returncode == 0, wide.stderr
    assert wide.stdout.split()[:12] == [
        "minimal", "Running", "4/10", "0.5", "0.5", "4", "2", "2", "0.75", "40", "3", "7"
    ]  # fmt: skip


# name -> (how the minimal spec is changed, the field both sides must name or None when valid)
SPEC_CASES: dict[str, tuple[Any, str | None]] = {
    "minimal": (lambda spec: None, None),
    "async-window-equal": (
        lambda spec: spec["async"].update(windowSize=2),
        "spec.async.windowSize",
    ),
    "async-window-unset": (
        lambda spec: spec["async"].pop("windowSize"),
        "spec.async.windowSize",
    ),
    "sync-without-window": (lambda spec: spec.update({"async": {"enabled": False}}), None),
    "train-batch-zero": (lambda spec: spec.update(trainBatchSize=0), "spec.trainBatchSize"),
    "train-batch-too-large": (lambda spec: spec.update(trainBatchSize=100_001), "spec.trainBatchSize"),
    "no-data-source": (lambda spec: spec.update(data={"shuffle": False}), "spec.data"),
    "empty-inline-data": (lambda spec: spec.update(data={"inline": []}), "spec.data.inline"),
    "config-map-data": (
        lambda spec: spec.update(data={"configMapRef": {"name": "rows", "key": "rows.jsonl"}}),
        None,
    ),
    "threshold-one": (
        lambda spec: spec.update(rolloutCorrection={"threshold": 1}),
        "spec.rolloutCorrection.threshold",
    ),
    "unknown-mode": (
        lambda spec: spec.update(rolloutCorrection={"mode": "tokens"}),
        "spec.rolloutCorrection.mode",
    ),
    "port-too-high": (lambda spec: spec.update(gateway={"port": 70000}), "spec.gateway.port"),
    "agent-url-not-http": (
        lambda spec: spec.update(gateway={"agentURL": "gateway:8090"}),
        "spec.gateway.agentURL",
    ),
    "two-templates": (
        lambda spec: spec["agents"]["template"].update(configMapRef={"name": "t", "key": "job"}),
        "spec.agents.template",
    ),
    "negative-ttl": (
        lambda spec: spec["agents"].update(ttlSecondsAfterFinished=-1),
        "spec.agents.ttlSecondsAfterFinished",
    ),
    "keep-policy": (lambda spec: spec["async"].update(stalenessPolicy="Keep", maxCarryOverAgeSteps=3), None),
    "gpus-negative": (lambda spec: spec["trainer"].update(gpus=-1), "spec.trainer.gpus"),
    "missing-model-path": (lambda spec: spec["model"].pop("path"), "spec.model.path"),
    "nodes-zero": (lambda spec: spec["trainer"].update(nodes=0), "spec.trainer.nodes"),
    "multi-node-without-checkpoint-claim": (
        lambda spec: spec["trainer"].update(backend="Verl", nodes=2),
        "spec.trainer.checkpoint.claimName",
    ),
    "multi-node-reference-backend": (
        lambda spec: spec["trainer"].update(backend="Reference", nodes=2, checkpoint={"claimName": "ckpt"}),
        "spec.trainer.nodes",
    ),
    "multi-node-gateway-port-in-rays-range": (
        lambda spec: (
            spec["trainer"].update(backend="Verl", nodes=2, checkpoint={"claimName": "ckpt"}),
            spec.update(gateway={"port": 10500}),
        ),
        "spec.gateway.port",
    ),
    "multi-node-gateway-port-rays-dashboard": (
        lambda spec: (
            spec["trainer"].update(backend="Verl", nodes=2, checkpoint={"claimName": "ckpt"}),
            spec.update(gateway={"port": 8265}),
        ),
        "spec.gateway.port",
    ),
    "one-node-gateway-port-in-rays-range": (lambda spec: spec.update(gateway={"port": 10500}), None),
    "verl-update-rows-not-divisible-by-gpus": (  # 2 x 3 = 6 rows over 4 GPUs: verl asserts on its 1st update
        lambda spec: (
            spec["trainer"].update(backend="Verl", gpus=4),
            spec.update(trainBatchSize=2, rollout={"samplesPerPrompt": 3}),
        ),
        "spec.trainBatchSize",
    ),
    "verl-update-rows-divisible-by-gpus": (
        lambda spec: (
            spec["trainer"].update(backend="Verl", gpus=4),
            spec.update(trainBatchSize=2, rollout={"samplesPerPrompt": 2}),
        ),
        None,
    ),
    "verl-multi-node-rows-not-divisible": (  # 2 x 2 = 4 rows over 2 nodes x 4 GPUs
        lambda spec: spec["trainer"].update(
            backend="Verl", nodes=2, gpusPerNode=4, checkpoint={"claimName": "ckpt"}
        ),
        "spec.trainBatchSize",
    ),
    "reference-rows-over-gpus-not-checked": (
        lambda spec: (
            spec["trainer"].update(backend="Reference", gpus=4),
            spec.update(rollout={"samplesPerPrompt": 3}),
        ),
        None,
    ),
    "verl-rows-longer-than-the-token-budget": (
        lambda spec: (
            spec["trainer"].update(backend="Verl", gpus=1),
            spec["data"].update(maxPromptLength=12288, maxResponseLength=4097),
        ),
        "spec.data.maxPromptLength",
    ),
    "verl-rows-at-the-token-budget": (
        lambda spec: (
            spec["trainer"].update(backend="Verl", gpus=1),
            spec["data"].update(maxPromptLength=12288, maxResponseLength=4096),
        ),
        None,
    ),
    "multi-node-with-checkpoint-claim": (
        lambda spec: spec["trainer"].update(
            backend="Verl", nodes=2, gpusPerNode=2, checkpoint={"claimName": "ckpt"}
        ),
        None,
    ),
}


@pytest.mark.parametrize("case", sorted(SPEC_CASES))
def test_local_mode_rejects_exactly_what_the_api_server_rejects(
    api_client: Any, namespace: str, minimal_manifest: dict[str, Any], case: str
) -> None:
    change, field = SPEC_CASES[case]
    change(minimal_manifest["spec"])

    server, local = _server_verdict(api_client, namespace, minimal_manifest), _local_verdict(minimal_manifest)

    if field is None:
        assert (server, local) == (None, None)
    else:
        assert server is not None
        assert f"{field}:" in server, server
        assert local is not None
        assert f"{field}:" in local, local


@pytest.mark.parametrize(
    ("train_batch_size", "async_window_size"),
    [(1, 1), (7, None), (10, 10), (12345, 100), (54321, 54321), (100_000, 100_000), (100_000, 99_999)],
)
def test_the_server_words_the_async_rule_exactly_as_local_mode(
    api_client: Any,
    namespace: str,
    minimal_manifest: dict[str, Any],
    train_batch_size: int,
    async_window_size: int | None,
) -> None:
    spec = minimal_manifest["spec"]
    spec["trainBatchSize"] = train_batch_size
    spec["async"] = {"enabled": True}
    if async_window_size is not None:
        spec["async"]["windowSize"] = async_window_size

    server, local = _server_verdict(api_client, namespace, minimal_manifest), _local_verdict(minimal_manifest)

    assert server is not None
    assert local is not None
    local_message = local.splitlines()[-1].strip()  # "spec.async.windowSize: windowSize (..."
    assert local_message.startswith("spec.async.windowSize: ")
    assert local_message.removeprefix("spec.async.windowSize: ") in server
    assert f"try windowSize: {2 * train_batch_size} (2 x trainBatchSize)" in server


@pytest.mark.parametrize("margin", [0, 1])
def test_validate_knows_where_client_side_kubectl_apply_stops(
    kubectl: list[str], namespace: str, minimal_manifest: dict[str, Any], margin: int
) -> None:
    """`kubectl apply` copies the manifest into its last-applied annotation; past 256 KiB of annotations the
    API server refuses it. `asyncrl validate`'s count (size_limits.py) is exact: 0 bytes over is applied, 1 is
    refused. (Without the namespace it applies to, validate counts the longest namespace name: safe side.)"""
    from asyncrl.manifest.size_limits import (
        MAX_ANNOTATION_BYTES,
        client_side_apply_problem,
        last_applied_bytes,
    )

    rows = minimal_manifest["spec"]["data"]["inline"]
    rows.append({"question": "", "answer": "<&>"})  # Go's JSON writes these as 6 bytes each
    padding = MAX_ANNOTATION_BYTES + margin - last_applied_bytes(minimal_manifest, namespace=namespace)
    rows[-1]["question"] = "x" * padding
    assert last_applied_bytes(minimal_manifest, namespace=namespace) == MAX_ANNOTATION_BYTES + margin

    applied = apply_run(kubectl, namespace, minimal_manifest)

    if margin <= 0:
        assert client_side_apply_problem(minimal_manifest, namespace=namespace) is None
        assert applied.returncode == 0, applied.stderr
    else:
        assert client_side_apply_problem(minimal_manifest, namespace=namespace) is not None
        assert client_side_apply_problem(minimal_manifest) is not None  # the longest namespace, the safe side
        assert applied.returncode != 0
        assert "metadata.annotations: Too long" in applied.stderr, applied.stderr


def _assert_verdicts(
    api_client: Any,
    namespace: str,
    manifest: dict[str, Any],
    *,
    server_says: str | None,
    local_says: str | None,
) -> None:
    """Both admit the manifest (says None), or both refuse it, each in the words given."""
    server, local = _server_verdict(api_client, namespace, manifest), _local_verdict(manifest)
    if server_says is None:
        assert (server, local) == (None, None)
    else:
        assert server is not None
        assert server_says in server, server
        assert local is not None
        assert local_says in local, local


@pytest.mark.parametrize(
    ("resources", "server_says", "local_says"),
    [
        (
            {"requests": {"cpu": "-1"}},
            "a resource quantity is negative",
            "spec.trainer.resources.requests.cpu: '-1' is negative",
        ),
        (
            {"limits": {"cpu": -2}},
            "a resource quantity is negative",
            "spec.trainer.resources.limits.cpu: '-2' is negative",
        ),
        (
            {"requests": {"memory": "1Gi"}, "limits": {"memory": "512Mi"}},
            "spec.trainer.resources.limits: Invalid value: a limit is below the request",
            "spec.trainer.resources.limits.memory: the limit '512Mi' is below the request '1Gi'",
        ),
        (
            {"requests": {"memory": "1Gi", "cpu": 1}, "limits": {"memory": "1024Mi", "cpu": "1000m"}},
            None,
            None,
        ),
    ],
)
def test_quantities_the_api_server_would_refuse_in_the_pod_are_refused_at_admission(
    api_client: Any,
    namespace: str,
    minimal_manifest: dict[str, Any],
    resources: dict[str, Any],
    server_says: str | None,
    local_says: str | None,
) -> None:
    """Before the CEL rules these were admitted, and the trainer Job got a 422 when the operator made it."""
    minimal_manifest["spec"]["trainer"]["resources"] = resources
    _assert_verdicts(api_client, namespace, minimal_manifest, server_says=server_says, local_says=local_says)


@pytest.mark.parametrize(
    ("pod_template", "server_says", "local_says"),
    [
        (
            {"metadata": {"labels": {"bad key!": "x"}}},
            "the trainer pod's labels: a key is not a label key",
            "label key 'bad key!'",
        ),
        (
            {"metadata": {"labels": {"example.com/": "x"}}},
            "the trainer pod's labels: a key is not a label key",
            "label key 'example.com/'",
        ),
        (
            {"metadata": {"labels": {"team": "x" * 64}}},
            "spec.trainer.podTemplate.metadata.labels.team: Too long",
            "label value",
        ),
        (
            {"metadata": {"labels": {"team": "-ml"}}},
            "spec.trainer.podTemplate.metadata.labels.team: Invalid value",
            "label value '-ml'",
        ),
        (
            {"nodeSelector": {"-gpu": "h200"}},
            "the trainer pod's nodeSelector: a key is not a label key",
            "label key '-gpu'",
        ),
        (
            {"nodeSelector": {"nvidia.com/gpu.product": "NVIDIA H200"}},
            "spec.trainer.podTemplate.nodeSelector.nvidia.com/gpu.product: Invalid value",
            "label value 'NVIDIA H200'",
        ),
        (
            {
                "metadata": {"labels": {"example.com/team": "ml", "kueue.x-k8s.io/queue-name": "", "a": "b"}},
                "nodeSelector": {"nvidia.com/gpu.product": "NVIDIA-H200", "x" * 63: "y" * 63},
            },
            None,
            None,
        ),
    ],
)
def test_label_keys_and_values_the_api_server_would_refuse_in_the_pod_are_refused_at_admission(
    api_client: Any,
    namespace: str,
    minimal_manifest: dict[str, Any],
    pod_template: dict[str, Any],
    server_says: str | None,
    local_says: str | None,
) -> None:
    """Before these rules a bad label key or value was admitted, and the trainer Job got a 422."""
    minimal_manifest["spec"]["trainer"]["podTemplate"] = pod_template
    _assert_verdicts(api_client, namespace, minimal_manifest, server_says=server_says, local_says=local_says)
