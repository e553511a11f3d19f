"""`agents.mode: Pool` on the real control plane: a Deployment of agent pods takes the rollouts.

Counted, not assumed: each agent execution appends a line (its rollout's event URL, its pid and its runner's
pid) to a file, so a rollout run twice shows up twice, whatever the gateway says.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path
from typing import Any

import pytest

from asyncrl.testing.podrunner import PodRunner
from asyncrl.testing.waiting import wait_for
from asyncrl.workloads import names
from tests.operator.conftest import OperatorStarter
from tests.support.kube import (
    agent_jobs,
    apply_ok,
    counting_agent_template,
    execution_lines,
    executions_per_rollout,
    run_manifest,
    run_status,
    wait_for_phase,
)

pytestmark = [pytest.mark.controlplane, pytest.mark.slow]


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def _pool_manifest(name: str, executions: Path, rows: list[dict[str, str]], **spec: Any) -> dict[str, Any]:
    manifest = run_manifest(name, template=counting_agent_template(executions), **spec)
    manifest["spec"]["data"]["inline"] = rows
    manifest["spec"]["agents"]["mode"] = "Pool"
    manifest["spec"]["agents"]["pool"] = {"replicas": 2}
    return manifest


def _deployment(api_client: Any, namespace: str, run: str) -> Any | None:
    from kubernetes import client
    from kubernetes.client.exceptions import ApiException

    try:
        return client.AppsV1Api(api_client).read_namespaced_deployment(names.agent_pool_name(run), namespace)
    except ApiException as error:
        if error.status == 404:
            return None
        raise


def test_a_pool_run_finishes_each_rollout_once_without_jobs_and_its_pool_goes_with_the_run(
    api_client: Any,
    pod_runner: PodRunner,
    namespace: str,
    kubectl: list[str],
    start_operator: OperatorStarter,
    tmp_path: Path,
) -> None:
    from kubernetes import client

    executions = tmp_path / "executions.log"
    manifest = _pool_manifest("pooled", executions, [{"behaviour": "ok"}] * 2, totalSteps=2)
    start_operator()
    apply_ok(kubectl, namespace, manifest)
    status = wait_for_phase(
        api_client, namespace, "pooled", "Succeeded", timeout=240, what="the Pool run to finish"
    )
    counted = executions_per_rollout(executions)
    assert set(counted) == {f"s{step}-g{g}-r{r}" for step in range(2) for g in range(2) for r in range(2)}
    assert set(counted.values()) == {1}, counted
    runners = {runner for _, _, runner in execution_lines(executions)}
    assert len(runners) <= 2  # two long-lived pods ran all eight rollouts (no process per rollout)
    assert status["jobs"]["created"] == 8  # launches, as in Jobs mode
    assert status["jobs"]["failed"] == 0
    assert status["rollouts"]["succeeded"] == 8
    assert agent_jobs(api_client, namespace, "pooled") == []
    deployment = _deployment(api_client, namespace, "pooled")
    assert deployment is not None
    assert deployment.spec.replicas == 2
    assert deployment.metadata.owner_references[0].name == "pooled"
    container = deployment.spec.template.spec.containers[0]
    assert container.command == ["asyncrl", "agent-pool"]
    assert "ASYNCRL_GATEWAY_KEY" not in {entry.name for entry in container.env}  # never the gateway key

    client.CustomObjectsApi(api_client).delete_namespaced_custom_object(
        "asyncrl.dev", "v1alpha1", namespace, "asynctrainingruns", "pooled"
    )
    wait_for(
        lambda: _deployment(api_client, namespace, "pooled") is None,
        timeout=120,
        what="the garbage collector to delete the pool Deployment with its run",
    )


def test_a_pool_runner_killed_mid_rollout_fails_that_rollout_and_never_runs_it_again(
    api_client: Any,
    pod_runner: PodRunner,
    namespace: str,
    kubectl: list[str],
    start_operator: OperatorStarter,
    tmp_path: Path,
) -> None:
    executions = tmp_path / "executions.log"
    # g0 hangs (both its rollouts, one per pod); g1 finishes normally, after the kill.
    manifest = _pool_manifest(
        "killed-pool", executions, [{"behaviour": "hang"}, {"behaviour": "ok"}], totalSteps=1
    )
    start_operator()
    apply_ok(kubectl, namespace, manifest)
    hanging = {"s0-g0-r0", "s0-g0-r1"}

    def both_hanging() -> list[tuple[str, int, int]] | None:
        lines = [line for line in execution_lines(executions) if line[0] in hanging]
        return lines if len(lines) == 2 else None

    lines = wait_for(both_hanging, timeout=180, what="both pool pods to run a hanging rollout")

    def shows_both_running() -> bool:
        status = run_status(api_client, namespace, "killed-pool")
        return (status.get("rollouts") or {}).get("running") == 2 and (status.get("jobs") or {}).get(
            "active"
        ) == 2

    # A pool makes no agent Jobs: its running agents are what jobs.active shows (kubectl get atr's ACTIVE),
    # and with no Job events between steps the writer learns of them from the counts it reads (CI caught the
    # status never written while both agents hung).
    wait_for(shows_both_running, timeout=120, what="the status to show the pool's two running agents")
    for _, _, runner in lines:
        os.kill(runner, signal.SIGKILL)  # the pool runner, the container's main process: no grace, no report
    wait_for(
        lambda: not any(_alive(agent) for _, agent, _ in lines),
        timeout=30,
        what="the killed runners' agents to die with them (PR_SET_PDEATHSIG)",
    )
    status = wait_for_phase(
        api_client,
        namespace,
        "killed-pool",
        "Succeeded",
        timeout=240,
        what="the run to finish after the restarted pods failed the interrupted rollouts",
    )
    counted = executions_per_rollout(executions)
    assert counted == {"s0-g0-r0": 1, "s0-g0-r1": 1, "s0-g1-r0": 1, "s0-g1-r1": 1}, counted
    restarted_runners = {
        runner for rollout, _, runner in execution_lines(executions) if rollout not in hanging
    }
    assert not restarted_runners & {runner for _, _, runner in lines}  # g1 ran in the restarted runners
    assert status["rollouts"]["failed"] == 2
    assert status["rollouts"]["succeeded"] == 2
    assert status["jobs"]["failed"] == 2
