"""End to end on the real control plane: kubectl apply → operator → trainer pod → agent Jobs → status.

Real: kube-apiserver with the CRD (CEL), the Job/GC/TTL controllers, the `asyncrl operator` process, the
trainer pod's `asyncrl gateway` sidecar and `asyncrl trainer` (reference backend, verl's GRPO code), and the
toy agent of the quickstart in every agent Job. Stand-in: the pod runner runs pods' containers as local
processes (there is no kubelet or container runtime here), with each image mapped to the local install.
"""

from __future__ import annotations

import json
import subprocess
from typing import Any

import pytest

from asyncrl.launch.podspec import Image, ImageTable
from asyncrl.testing.podrunner import PodRunner
from asyncrl.testing.waiting import wait_for
from tests.operator.conftest import OperatorStarter
from tests.support.kube import (
    agent_template,
    apply_ok,
    delete_run,
    events,
    run_manifest,
    run_status,
    wait_for_no_jobs_or_pods,
    wait_for_phase,
)
from tests.support.wandb_log import history

pytestmark = [pytest.mark.controlplane, pytest.mark.slow]

TRAINER_IMAGE = "asyncrl.test/trainer"
TOY_AGENT = agent_template(
    command=["python", "-m", "examples.toy_agent.agent"], env={"ROW": "{{ input | tojson }}"}
)
SEED_METRICS = [
    "training/async/n_prev_carry_over_rollouts",
    "training/async/n_completed_rollouts",
    "training/async/n_new_carry_over_rollouts",
    "training/async/new_carry_over_age_max_steps",
    "training/async/proxy_inflight_at_pause",
    "training/async/proxy_drain_seconds",
]


@pytest.fixture(autouse=True)
def _real_trainer_image(image_table: ImageTable) -> None:
    image_table[TRAINER_IMAGE] = Image()  # the pod's own command: `asyncrl trainer ...`


def _columns(kubectl: list[str], namespace: str) -> dict[str, str] | None:
    table = subprocess.run(
        [*kubectl, "get", "atr", "-n", namespace], capture_output=True, text=True, check=True
    )
    lines = table.stdout.splitlines()
    if len(lines) < 2:
        return None
    return dict(zip(lines[0].split(), lines[1].split(), strict=False))


def test_apply_trains_with_carry_over_and_delete_leaves_nothing(
    api_client: Any,
    pod_runner: PodRunner,
    namespace: str,
    kubectl: list[str],
    start_operator: OperatorStarter,
) -> None:
    start_operator()
    manifest = run_manifest("e2e", template=TOY_AGENT, totalSteps=6)
    spec = manifest["spec"]
    spec["data"]["inline"] = [
        {"prompt": p, "target": "ab", "tool_seconds": 0.2} for p in ("a", "b", "c", "d")
    ]
    spec.update(trainBatchSize=2, rollout={"samplesPerPrompt": 2}, rolloutTimeoutSeconds=120)
    spec["async"] = {"enabled": True, "windowSize": 4}
    spec["trainer"] = {
        "backend": "Reference",
        "image": TRAINER_IMAGE,
        "gpus": 0,
        "checkpoint": {"everySteps": 2},
    }
    spec["logging"] = {"wandb": {"mode": "Offline", "project": "e2e"}}
    apply_ok(kubectl, namespace, manifest)

    seen: list[dict[str, str]] = []

    def finished() -> bool:
        columns = _columns(kubectl, namespace)
        if columns:
            seen.append(columns)
        return bool(columns) and columns.get("PHASE") == "Succeeded"

    wait_for(finished, timeout=420, interval=1.0, what="the run to succeed (kubectl get atr)")
    # STEPS is `done/total`, counted from 1: a 6-step run ends at 6/6.
    steps = sorted({int(row["STEPS"].split("/")[0]) for row in seen if "/" in row.get("STEPS", "")})
    assert steps[-1] == 6
    assert {row["STEPS"].split("/")[1] for row in seen if "/" in row.get("STEPS", "")} == {"6"}
    assert len(steps) >= 3  # STEPS advanced while we watched
    assert any(row.get("REWARD", "<none>") != "<none>" for row in seen)  # the reward shows while it trains
    assert any(int(row["CARRY-OVER"]) > 0 for row in seen if row.get("CARRY-OVER", "").isdigit())
    assert any(int(row["MAX-AGE"]) >= 1 for row in seen if row.get("MAX-AGE", "").isdigit())

    (trainer_pod,) = [p for p in (pod_runner.work_dir / "pods").glob(f"{namespace}_e2e-trainer-*")]
    # The per-step metrics are kept on the checkpoint volume (metrics/ beside the checkpoints), W&B's too.
    (metrics_dir,) = trainer_pod.glob("volumes/checkpoints/metrics")
    kept = (metrics_dir / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(line)["step"] for line in kept] == [0, 1, 2, 3, 4, 5]
    (run_dir,) = (metrics_dir / "wandb").glob("offline-run-*")
    logged = history(run_dir)
    assert len(logged) == 6
    for metric in SEED_METRICS:
        assert all(metric in row for row in logged)

    deleted = delete_run(kubectl, namespace, "e2e")
    assert deleted.returncode == 0, deleted.stderr
    wait_for_no_jobs_or_pods(
        api_client, namespace, timeout=90, what="every Job and pod of the run to be gone"
    )


def test_a_gateway_sidecar_killed_mid_run_is_restarted_and_the_run_finishes_every_step(
    api_client: Any,
    pod_runner: PodRunner,
    namespace: str,
    kubectl: list[str],
    start_operator: OperatorStarter,
) -> None:
    """kill -9 of the gateway sidecar (the rollout store) mid-run: the pod restarts it, the trainer adopts the
    new gateway (model servers registered again, lost groups redrawn), the operator resets its cursor."""
    import os
    import signal

    from kubernetes import client

    start_operator()
    manifest = run_manifest("regw", template=TOY_AGENT, totalSteps=5)
    spec = manifest["spec"]
    spec["data"]["inline"] = [{"prompt": p, "target": "ab", "tool_seconds": 0.2} for p in ("a", "b", "c")]
    spec.update(trainBatchSize=2, rollout={"samplesPerPrompt": 2}, rolloutTimeoutSeconds=120)
    spec["async"] = {"enabled": True, "windowSize": 4}
    spec["trainer"] = {"backend": "Reference", "image": TRAINER_IMAGE, "gpus": 0}
    apply_ok(kubectl, namespace, manifest)
    wait_for(
        lambda: (run_status(api_client, namespace, "regw").get("step") or 0) >= 1,
        timeout=300,
        interval=1.0,
        what="step 1",
    )

    def gateway_container() -> dict[str, Any] | None:
        pods = client.CoreV1Api(api_client).list_namespaced_pod(
            namespace, label_selector="app.kubernetes.io/component=trainer"
        )
        for pod in pods.items:
            for container in pod.status.init_container_statuses or []:
                if container.name == "gateway" and container.container_id and container.state.running:
                    return {
                        "pid": int(container.container_id.rsplit("/", 1)[1]),
                        "restarts": container.restart_count,
                    }
        return None

    before = wait_for(gateway_container, timeout=60, what="the running gateway sidecar")
    os.killpg(before["pid"], signal.SIGKILL)
    after = wait_for(
        lambda: (found := gateway_container()) and found["restarts"] > before["restarts"] and found,
        timeout=120,
        what="the gateway sidecar to be restarted",
    )
    assert after["pid"] != before["pid"]
    final = wait_for_phase(
        api_client, namespace, "regw", "Succeeded", "Failed", timeout=420, interval=1.0, what="the run to end"
    )
    assert final["phase"] == "Succeeded", final.get("message")
    assert final["step"] == 4  # every step ran, under the new gateway too
    reasons = {item.get("reason") for item in events(kubectl, namespace)}
    assert "GatewayRestarted" in reasons
