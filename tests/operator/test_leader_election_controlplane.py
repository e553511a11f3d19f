"""Two operator replicas with `--leader-elect` on one namespace, the leader SIGKILLed mid-run, on the real
control plane.

One replica leads through the Lease (operator/leadership.py); the other stands by and does nothing: no
watch, no run task, no write. SIGKILL leaves the leader no time to release the Lease, so the standby takes
over once the Lease has gone unrenewed for its duration (15 s), then serves the run from where the leader
left it. What must hold:
- every rollout executed exactly once, counted by the agents themselves (a file each execution appends to),
  with `ttlSecondsAfterFinished: 0` so that no finished Job is left for the new leader to recognise. The kill
  comes while step 1's agents run, once each of its rollouts has its Job: a SIGKILL between a rollout's
  launch record and its Job's creation leaves that rollout failed, never relaunched (at most once: the new
  leader cannot tell a Job never created from one that ran and was removed; docs/install.md);
- the run ends Succeeded, and its status never steps back: every version the API server stored, seen
  through a watch, has `jobs.created`, `step` and the rollout counts at least those of the one before (two
  unelected operators stepped `jobs.created` back from 8 to 5);
- the standby did nothing while the leader lived: its client made no request but the Lease's and its
  permission reviews (its metrics), and kopf's watches start only once it leads.
The failover time (the kill to the new leader's first status write) is printed, not asserted.

Two shorter tests, without runs: a leader stopped gracefully (SIGTERM) releases the Lease, so the standby
takes it without waiting for it to expire; and a leader that reads another holder in the Lease exits at once
(code 1) with an ERROR line saying who holds it.
"""

from __future__ import annotations

import collections
import contextlib
import functools
import itertools
import os
import re
import signal
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from asyncrl.api.types.meta import GROUP, PLURAL, VERSION
from asyncrl.launch.processes import free_port
from asyncrl.operator.leadership import DEFAULT_LEASE_NAME
from asyncrl.testing.podrunner import PodRunner
from asyncrl.testing.processes import ServerProcess
from asyncrl.testing.waiting import WaitTimeout, wait_for
from asyncrl.workloads import names
from tests.operator.conftest import OperatorStarter
from tests.support.kube import (
    agent_jobs,
    apply_ok,
    counting_agent_template,
    events,
    executions_per_rollout,
    explain_run,
    pod_logs,
    run_manifest,
)

pytestmark = [pytest.mark.controlplane, pytest.mark.slow]

STEPS, ROWS, SAMPLES = 3, 2, 2  # a group per row and step, a rollout per sample
ROLLOUTS = STEPS * ROWS * SAMPLES
ENDED = ("succeeded", "failed", "timedOut", "cancelled")
PHASE_ORDER = {"Pending": 0, "Running": 1, "Succeeded": 2, "Failed": 2}
# What a standby's own client may call: the Lease, and the permission reviews behind its readiness.
STANDBY_RESOURCES = {"coordination.k8s.io/leases", "authorization.k8s.io/selfsubjectaccessreviews"}


class StatusHistory:
    """Every version of the run the API server sends through a watch, with the local time it arrived."""

    def __init__(self, api_client: Any, namespace: str, name: str) -> None:
        from kubernetes import client, watch

        self.versions: list[tuple[float, dict[str, Any]]] = []
        self._custom = client.CustomObjectsApi(api_client)
        self._watch = watch.Watch()  # type: ignore[no-untyped-call]
        self._namespace, self._name = namespace, name
        self._thread = threading.Thread(target=self._run, name="status-history", daemon=True)

    def __enter__(self) -> StatusHistory:
        self._thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._watch.stop()

    def _run(self) -> None:
        stream = self._watch.stream(
            self._custom.list_namespaced_custom_object,
            GROUP,
            VERSION,
            self._namespace,
            PLURAL,
            field_selector=f"metadata.name={self._name}",
            timeout_seconds=600,
        )
        last: dict[str, Any] | None = None
        with contextlib.suppress(Exception):  # the control plane stops under it at the test's end
            for event in stream:
                status = dict(event["raw_object"].get("status") or {})
                if status != last:  # a metadata-only change (kopf's annotations) is not a status write
                    self.versions.append((time.time(), status))
                    last = status

    def first_after(self, moment: float) -> float | None:
        return next((at for at, _ in self.versions if at > moment), None)


def _progress(status: dict[str, Any]) -> dict[str, int]:
    """The parts of a status that may only grow."""
    jobs, rollouts = status.get("jobs") or {}, status.get("rollouts") or {}
    return {
        "phase": PHASE_ORDER.get(status.get("phase") or "Pending", 0),
        "step": status.get("step") or 0,
        "jobs.created": jobs.get("created") or 0,
        "jobs.failed": jobs.get("failed") or 0,
        **{f"rollouts.{key}": rollouts.get(key) or 0 for key in ENDED},
    }


def _steps_back(versions: list[tuple[float, dict[str, Any]]]) -> list[str]:
    problems = []
    for (_, before), (_, after) in itertools.pairwise(versions):
        old, new = _progress(before), _progress(after)
        problems += [f"{key} {old[key]} -> {new[key]}" for key in old if new[key] < old[key]]
    return problems


def _metric_lines(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        return str(response.read().decode())


def _requested_resources(metrics: str) -> set[str]:
    pattern = r'^asyncrl_operator_api_requests_total\{[^}]*resource="([^"]*)"[^}]*\} (\S+)$'
    return {m[1] for m in re.finditer(pattern, metrics, re.MULTILINE) if float(m[2]) > 0}


def _leads(port: int) -> bool:
    return re.search(r"^asyncrl_operator_leader 1\.0$", _metric_lines(port), re.MULTILINE) is not None


def _holder(api_client: Any, namespace: str) -> str:
    from kubernetes import client

    try:
        lease = client.CoordinationV1Api(api_client).read_namespaced_lease(DEFAULT_LEASE_NAME, namespace)
    except client.exceptions.ApiException:
        return ""
    return str(lease.spec.holder_identity or "")


def _pid_of(identity: str) -> int:
    """Outside a pod the identity is hostname-pid-random (operator/elector.py)."""
    return int(identity.rsplit("-", 2)[-2])


def test_a_standby_takes_over_from_a_killed_leader_and_every_rollout_runs_once(
    api_client: Any,
    pod_runner: PodRunner,
    namespace: str,
    kubectl: list[str],
    start_operator: OperatorStarter,
    tmp_path: Path,
) -> None:
    executions = tmp_path / "executions.log"
    manifest = run_manifest("twice", template=counting_agent_template(executions), totalSteps=STEPS)
    manifest["spec"]["data"]["inline"] = [{"behaviour": "ok", "seconds": "2"}] * ROWS
    manifest["spec"]["rollout"]["samplesPerPrompt"] = SAMPLES
    manifest["spec"]["agents"]["ttlSecondsAfterFinished"] = 0
    metrics_ports = [free_port(), free_port()]
    operators: list[ServerProcess] = [
        start_operator("--leader-elect", f"--metrics-port={port}") for port in metrics_ports
    ]
    leader_identity = wait_for(lambda: _holder(api_client, namespace), timeout=60, what="a leader")
    pids = [operator.process.pid for operator in operators]
    leader = pids.index(_pid_of(leader_identity))
    standby = 1 - leader

    def explain() -> str:
        logs = [tmp_path / f"operator-{i}.log" for i in range(len(operators))]
        return explain_run(
            api_client, kubectl, namespace, "twice", logs=[*logs, *pod_logs(pod_runner.work_dir, namespace)]
        )

    def step_jobs_exist(step: int) -> bool:
        created = {
            job.metadata.annotations[names.ANNOTATION_ROLLOUT_ID]
            for job in agent_jobs(api_client, namespace)
            if job.metadata.annotations[names.ANNOTATION_ROLLOUT_ID].startswith(f"s{step}-")
        }
        return len(created) == ROWS * SAMPLES

    def ended(history: StatusHistory) -> dict[str, Any] | None:
        status = history.versions[-1][1] if history.versions else {}
        rollouts = status.get("rollouts") or {}
        counted = sum(rollouts.get(key) or 0 for key in ENDED) == ROLLOUTS
        return (
            status
            if status.get("phase") == "Failed" or (status.get("phase") == "Succeeded" and counted)
            else None
        )

    with StatusHistory(api_client, namespace, "twice") as history:
        apply_ok(kubectl, namespace, manifest)
        try:
            wait_for(functools.partial(step_jobs_exist, 1), timeout=180, what="step 1's agent Jobs")
            standby_metrics = _metric_lines(metrics_ports[standby])
            killed_at = time.time()
            os.killpg(operators[leader].process.pid, signal.SIGKILL)  # no grace, no release of the Lease
            operators[leader].process.wait(timeout=30)
            new_identity = wait_for(
                lambda: (holder := _holder(api_client, namespace)) != leader_identity and holder,
                timeout=60,
                what="the standby to take the Lease",
            )
            acquired_at = time.time()
            status = wait_for(functools.partial(ended, history), timeout=300, what="the run to end")
        except WaitTimeout as error:
            raise AssertionError(f"{error}\n{explain()}") from error
    assert _pid_of(str(new_identity)) == pids[standby]

    # The standby, while the leader lived: no request but the Lease's and the reviews', not leading.
    assert _requested_resources(standby_metrics) <= STANDBY_RESOURCES, standby_metrics
    assert re.search(r"^asyncrl_operator_leader 0\.0$", standby_metrics, re.MULTILINE), standby_metrics
    wait_for(lambda: _leads(metrics_ports[standby]), timeout=30, what="the new leader's metric")

    first_write = history.first_after(killed_at)
    assert first_write is not None, explain()
    print(
        f"failover: the Lease taken {acquired_at - killed_at:.1f} s after the SIGKILL (seen by polling), "
        f"the new leader's first status write {first_write - killed_at:.1f} s after it"
    )

    assert _steps_back(history.versions) == [], [v for _, v in history.versions]
    counted = executions_per_rollout(executions)
    expected = {f"s{s}-g{g}-r{r}" for s in range(STEPS) for g in range(ROWS) for r in range(SAMPLES)}
    assert len(expected) == ROLLOUTS
    assert set(counted) == expected, explain()  # every rollout ran, none is missing
    assert set(counted.values()) == {1}, counted  # each exactly once, across the failover
    assert status["phase"] == "Succeeded", explain()
    assert status["jobs"]["created"] == ROLLOUTS
    assert status["jobs"]["failed"] == 0
    assert status["rollouts"]["succeeded"] == ROLLOUTS
    reasons = collections.Counter(item.get("reason") for item in events(kubectl, namespace))
    assert not {"ChildRecreated", "ChildRecreateFailed", "ReconcileError", "AgentJobFailed"} & set(reasons)


def test_a_stopped_leader_releases_the_lease_and_the_standby_takes_it_without_waiting_for_expiry(
    api_client: Any, namespace: str, start_operator: OperatorStarter
) -> None:
    operators = [start_operator("--leader-elect"), start_operator("--leader-elect")]
    leader_identity = wait_for(lambda: _holder(api_client, namespace), timeout=60, what="a leader")
    pids = [operator.process.pid for operator in operators]
    leader = pids.index(_pid_of(leader_identity))
    standby = operators[1 - leader]
    operators[leader].stop()  # SIGTERM: kopf's cleanup stops the runs' tasks, then releases the Lease
    assert "leader election: released Lease" in operators[leader].log()
    holder = wait_for(
        lambda: (h := _holder(api_client, namespace)) != leader_identity and h,
        timeout=60,
        what="a new holder",
    )
    assert _pid_of(str(holder)) == standby.process.pid
    # It took the Lease because it was released, not because it expired.
    wait_for(lambda: "leads now" in standby.log(), timeout=30, what="the standby's log to say it leads")
    assert "the Lease was released)" in standby.log(), standby.log()[-3000:]


def test_a_leader_that_sees_another_holder_exits_at_once_with_an_error_saying_so(
    api_client: Any, namespace: str, start_operator: OperatorStarter
) -> None:
    from kubernetes import client

    operator = start_operator("--leader-elect")
    wait_for(lambda: _holder(api_client, namespace), timeout=60, what="the operator to lead")
    leases = client.CoordinationV1Api(api_client)
    lease = leases.read_namespaced_lease(DEFAULT_LEASE_NAME, namespace)
    lease.spec.holder_identity = "someone-else"
    leases.replace_namespaced_lease(DEFAULT_LEASE_NAME, namespace, lease)
    wait_for(lambda: operator.process.poll() is not None, timeout=60, what="the operator to exit")
    assert operator.process.returncode == 1, operator.log()[-3000:]
    assert re.search(r"ERROR .*lost Lease .*: someone-else holds the Lease now; exiting", operator.log())
