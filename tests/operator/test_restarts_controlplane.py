"""Fault suites on the real control plane: operator restarts, failing agents, deletion without an operator.

Each test counts what happened (agent executions appended to a file, Jobs, rollout outcomes seen by the
stand-in trainer) rather than what holds by construction (Job names are deterministic, so counting unique
names proves nothing about duplicate executions).
"""

from __future__ import annotations

import functools
import os
import re
import signal
from pathlib import Path
from typing import Any

import pytest

from asyncrl.testing.podrunner import PodRunner
from asyncrl.testing.processes import ServerProcess
from asyncrl.testing.waiting import wait_for
from asyncrl.workloads import names
from tests.operator.conftest import OperatorStarter
from tests.support.kube import (
    agent_jobs,
    apply_ok,
    counting_agent_template,
    delete_run,
    events,
    executions_per_rollout,
    run_manifest,
    run_object,
    run_status,
    wait_for_no_jobs_or_pods,
    wait_for_phase,
)

pytestmark = [pytest.mark.controlplane, pytest.mark.slow]


def _kill(operator: ServerProcess) -> None:
    """SIGKILL, no grace: nothing the operator holds in memory survives."""
    os.killpg(operator.process.pid, signal.SIGKILL)
    operator.process.wait(timeout=30)


def _trainer_log(pod_runner: PodRunner, namespace: str, run: str) -> str:
    logs = list((pod_runner.work_dir / "pods").glob(f"{namespace}_{run}-trainer-*/trainer.log"))
    return "\n".join(log.read_text() for log in logs)


def _outcomes(log: str) -> dict[str, tuple[str, str]]:
    """rollout id → (state, message) as the stand-in trainer received them from the completion feed."""
    return {m[1]: (m[2], m[3]) for m in re.finditer(r"^rollout (\S+) (\w+): (.*)$", log, re.MULTILINE)}


def test_an_operator_killed_three_times_with_ttl_0_executes_every_rollout_exactly_once(
    api_client: Any,
    pod_runner: PodRunner,
    namespace: str,
    kubectl: list[str],
    start_operator: OperatorStarter,
    tmp_path: Path,
) -> None:
    executions = tmp_path / "executions.log"
    manifest = run_manifest("killed", template=counting_agent_template(executions), totalSteps=3)
    manifest["spec"]["data"]["inline"] = [{"behaviour": "ok", "seconds": "4"}] * 2
    manifest["spec"]["agents"]["ttlSecondsAfterFinished"] = 0
    operator = start_operator()
    apply_ok(kubectl, namespace, manifest)

    def step_jobs(step: int) -> list[Any]:
        return [
            job
            for job in agent_jobs(api_client, namespace)
            if job.metadata.annotations[names.ANNOTATION_ROLLOUT_ID].startswith(f"s{step}-")
        ]

    def all_jobs_exist(step: int) -> bool:
        return len(step_jobs(step)) == 4

    def finished_and_removed(step: int) -> bool:
        executed = sum(n for r, n in executions_per_rollout(executions).items() if r.startswith(f"s{step}-"))
        return executed == 4 and not step_jobs(step)

    for step in range(3):
        # Every Job of the step exists and its agents are running: kill the operator now. Their Jobs finish
        # and are removed (TTL 0) while it is down, so a restarted operator can only learn of them from
        # the gateway's launch record.
        wait_for(functools.partial(all_jobs_exist, step), timeout=120, what=f"the 4 Jobs of step {step}")
        _kill(operator)
        wait_for(
            functools.partial(finished_and_removed, step),
            timeout=90,
            what=f"step {step}'s agents to finish and their Jobs to be removed while the operator is down",
        )
        operator = start_operator()

    status = wait_for_phase(
        api_client, namespace, "killed", "Succeeded", timeout=180, what="the run to finish"
    )
    counted = executions_per_rollout(executions)
    expected = {f"s{step}-g{g}-r{r}" for step in range(3) for g in range(2) for r in range(2)}
    assert set(counted) == expected
    assert set(counted.values()) == {1}, counted  # executed exactly once each
    assert status["jobs"]["created"] == sum(counted.values()) == 12
    assert status["jobs"]["failed"] == 0
    assert status["rollouts"]["succeeded"] == 12  # reported rewards stand: finished while nobody watched
    outcomes = _outcomes(_trainer_log(pod_runner, namespace, "killed"))
    assert {state for state, _ in outcomes.values()} == {"succeeded"}
    assert sum("removed while the operator was away" in message for _, message in outcomes.values()) >= 4


def test_failing_timed_out_and_deleted_agent_jobs_end_their_rollouts_and_the_groups_complete(
    api_client: Any,
    pod_runner: PodRunner,
    namespace: str,
    kubectl: list[str],
    start_operator: OperatorStarter,
    tmp_path: Path,
) -> None:
    from kubernetes import client

    executions = tmp_path / "executions.log"
    manifest = run_manifest(
        "faults", template=counting_agent_template(executions), totalSteps=1, rolloutTimeoutSeconds=15
    )
    manifest["spec"]["data"]["inline"] = [
        {"behaviour": "ok", "seconds": "0"},  # g0
        {"behaviour": "fail", "seconds": "0"},  # g1: exits 3
        {"behaviour": "hang", "seconds": "0"},  # g2: runs past the rollout timeout
        {"behaviour": "hang", "seconds": "0"},  # g3: its Jobs get deleted
    ]
    manifest["spec"]["agents"]["ttlSecondsAfterFinished"] = 0
    start_operator()
    apply_ok(kubectl, namespace, manifest)
    doomed = {"s0-g3-r0", "s0-g3-r1"}
    wait_for(
        lambda: doomed <= set(executions_per_rollout(executions)), timeout=120, what="g3's agents to start"
    )
    batch = client.BatchV1Api(api_client)
    for job in agent_jobs(api_client, namespace):
        if job.metadata.annotations[names.ANNOTATION_ROLLOUT_ID] in doomed:
            batch.delete_namespaced_job(job.metadata.name, namespace, propagation_policy="Background")

    status = wait_for_phase(
        api_client,
        namespace,
        "faults",
        "Succeeded",
        timeout=180,
        what="the stand-in trainer to see every group complete",
    )
    outcomes = _outcomes(_trainer_log(pod_runner, namespace, "faults"))
    states = {rollout_id: state for rollout_id, (state, _) in outcomes.items()}
    assert states == {
        "s0-g0-r0": "succeeded",
        "s0-g0-r1": "succeeded",
        "s0-g1-r0": "failed",
        "s0-g1-r1": "failed",
        "s0-g2-r0": "timed_out",
        "s0-g2-r1": "timed_out",
        "s0-g3-r0": "failed",
        "s0-g3-r1": "failed",
    }
    assert "deleted before it finished" in outcomes["s0-g3-r0"][1]
    assert set(executions_per_rollout(executions).values()) == {1}
    # TTL 0 removed every finished Job; the counts of the status keep them.
    wait_for(lambda: not agent_jobs(api_client, namespace), timeout=60, what="TTL to remove the Jobs")
    status = wait_for(
        lambda: (s := run_status(api_client, namespace, "faults"))["jobs"]["active"] == 0 and s,
        timeout=30,
        what="no active Job in the status",
    )
    assert status["jobs"]["created"] == 8
    assert status["jobs"]["failed"] == 6


def test_a_run_deleted_while_the_operator_is_down_disappears_and_its_jobs_are_collected(
    api_client: Any,
    pod_runner: PodRunner,
    namespace: str,
    kubectl: list[str],
    start_operator: OperatorStarter,
    tmp_path: Path,
) -> None:
    operator = start_operator()
    manifest = run_manifest("orphan", template=counting_agent_template(tmp_path / "x.log"), totalSteps=50)
    manifest["spec"]["data"]["inline"] = [{"behaviour": "hang", "seconds": "0"}] * 2
    apply_ok(kubectl, namespace, manifest)
    wait_for(lambda: len(agent_jobs(api_client, namespace)) == 4, timeout=120, what="the agent Jobs")
    assert not run_object(api_client, namespace, "orphan")["metadata"].get("finalizers")
    _kill(operator)
    deleted = delete_run(kubectl, namespace, "orphan", timeout="30s")
    assert deleted.returncode == 0, deleted.stderr
    wait_for_no_jobs_or_pods(
        api_client, namespace, timeout=90, what="the garbage collector to remove every Job and pod of the run"
    )
    assert "ReconcileError" not in {item.get("reason") for item in events(kubectl, namespace)}
