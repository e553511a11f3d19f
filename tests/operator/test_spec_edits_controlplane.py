"""Each mutable field of a running run, edited on the real control plane, takes effect (issue 25).

The fields and their promised effects are docs/crd-reference.md "Changing a run's spec" (rules.py
MUTABLE_FIELDS); `spec.suspend` and `spec.agents.template` are shown in test_reconcile_controlplane.py. Each
test here edits one of the others mid-run and fails if the operator ignored the edit.

Real parts: kube-apiserver, the Job/Deployment controllers, the `asyncrl operator` process, the gateway
sidecar. Stand-ins: the pod runner for the kubelet, `tests/operator/stub_trainer.py` for the trainer (it
creates each step's rollouts at once and waits for them all before the next step).

Agents here are gated: each notes its start, waits until the test creates a gate file, then answers, and notes
its end, so a test holds a step's rollouts until its edit is applied and reads when each agent ran.
"""

from __future__ import annotations

import itertools
import json
import re
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from asyncrl.testing.podrunner import PodRunner
from asyncrl.testing.waiting import wait_for
from asyncrl.workloads import names
from tests.operator.conftest import OperatorStarter
from tests.support.kube import (
    AGENT_TEMPLATE,
    agent_jobs,
    agent_template,
    apply_ok,
    counting_agent_template,
    events,
    kubectl_run,
    run_manifest,
    wait_for_phase,
)

pytestmark = [pytest.mark.controlplane, pytest.mark.slow]

_GATED_AGENT = """
import os, time
from pathlib import Path
def note(what):
    with open(os.environ["EXECUTIONS"], "a") as log:
        log.write(f"{what} {os.environ['AGL_EVENT_URL']} {time.time()}\\n")
note("start")
while not Path(os.environ["GATE"]).exists():
    time.sleep(0.1)
from asyncrl.agent import chat, report_reward
chat([{"role": "user", "content": "hi"}])
time.sleep(float(os.environ["HOLD"]))
report_reward(1.0)
note("end")
"""


def _gated_template(executions: Path, gate: Path, *, hold: float = 0.0) -> str:
    """An agent that notes `start <event URL> <time>` in `executions`, waits for `gate` to exist, calls the
    model, holds `hold` seconds, reports a reward and notes `end ...`."""
    return agent_template(
        command=["python", "-c", _GATED_AGENT],
        env={"EXECUTIONS": f'"{executions}"', "GATE": f'"{gate}"', "HOLD": f'"{hold}"'},
    )


def _agent_runs(executions: Path) -> dict[str, dict[str, float]]:
    """Per rollout id, the time of its agent's `start` and (once there) `end`."""
    runs: dict[str, dict[str, float]] = {}
    if not executions.exists():
        return runs
    for line in executions.read_text().splitlines():
        match = re.fullmatch(r"(start|end) \S*/api/rollouts/([^/]+)/attempt/\S+ (\S+)", line)
        assert match is not None, line
        runs.setdefault(match[2], {})[match[1]] = float(match[3])
    return runs


def _patch_agents(kubectl: list[str], namespace: str, run: str, **fields: Any) -> None:
    patch = {"spec": {"agents": fields}}
    out = kubectl_run(kubectl, "patch", "-n", namespace, "atr", run, "--type=merge", "-p", json.dumps(patch))
    assert out.returncode == 0, out.stderr


def _wait_spec_changed(kubectl: list[str], namespace: str, field: str) -> None:
    """The operator's SpecChanged event naming `field` (posted once it applied the edit)."""
    wait_for(
        lambda: [e for e in events(kubectl, namespace, reason="SpecChanged") if field in e["note"]],
        timeout=60,
        what=f"the SpecChanged event for {field}",
    )


def _jobs_once(api_client: Any, namespace: str, run: str, count: int) -> list[Any] | None:
    """The run's agent Jobs once there are `count` of them."""
    jobs = agent_jobs(api_client, namespace, run)
    return jobs if len(jobs) >= count else None


def _created(job: Any) -> datetime:
    created: datetime = job.metadata.creation_timestamp
    return created


def test_max_active_jobs_lowered_mid_run_caps_the_agent_jobs_launched_after(
    api_client: Any,
    pod_runner: PodRunner,
    namespace: str,
    kubectl: list[str],
    start_operator: OperatorStarter,
    tmp_path: Path,
) -> None:
    """Four rollouts a step; the cap of 4 lets step 0's four agents run at once. Lowered to 1 while they wait
    on the gate, it makes step 1's four agents run one after the other (each holds 2 s, so four launched at
    once would overlap)."""
    start_operator()
    executions, gate = tmp_path / "executions", tmp_path / "gate"
    manifest = run_manifest("cap", template=_gated_template(executions, gate, hold=2.0))
    manifest["spec"]["agents"]["maxActiveJobs"] = 4
    apply_ok(kubectl, namespace, manifest)

    def step_running(step: int, count: int) -> dict[str, dict[str, float]] | None:
        runs = {
            rollout: run
            for rollout, run in _agent_runs(executions).items()
            if rollout.startswith(f"s{step}-")
        }
        return runs if len(runs) >= count else None

    before = wait_for(lambda: step_running(0, 4), timeout=180, what="step 0's four agents to start")
    assert all("end" not in run for run in before.values()), before  # four at once, before the edit

    _patch_agents(kubectl, namespace, "cap", maxActiveJobs=1)
    _wait_spec_changed(kubectl, namespace, "agents.maxActiveJobs")
    gate.touch()
    wait_for_phase(api_client, namespace, "cap", "Succeeded", timeout=240, what="the run to succeed")

    after = sorted(
        (run["start"], run["end"], rollout)
        for rollout, run in _agent_runs(executions).items()
        if rollout.startswith("s1-")
    )
    assert len(after) == 4, after
    for (_, ended, first), (started, _, second) in itertools.pairwise(after):
        assert started > ended, f"{second} started before {first} ended: {after}"
    assert len(agent_jobs(api_client, namespace, "cap")) == 8


def test_ttl_seconds_after_finished_edited_mid_run_is_on_the_agent_jobs_launched_after(
    api_client: Any,
    pod_runner: PodRunner,
    namespace: str,
    kubectl: list[str],
    start_operator: OperatorStarter,
    tmp_path: Path,
) -> None:
    """Step 0's two agent Jobs are launched with a TTL of 600 s and wait on the gate; the TTL is then edited
    to 1234: step 1's Jobs carry 1234, step 0's keep 600."""
    start_operator()
    executions, gate = tmp_path / "executions", tmp_path / "gate"
    manifest = run_manifest("ttl", template=_gated_template(executions, gate))
    manifest["spec"]["data"]["inline"] = [{"question": "what is 2+2?"}]
    apply_ok(kubectl, namespace, manifest)
    first = wait_for(
        lambda: _jobs_once(api_client, namespace, "ttl", 2),
        timeout=180,
        what="step 0's two agent Jobs",
    )
    launched_before = {job.metadata.uid for job in first}

    _patch_agents(kubectl, namespace, "ttl", ttlSecondsAfterFinished=1234)
    _wait_spec_changed(kubectl, namespace, "agents.ttlSecondsAfterFinished")
    gate.touch()
    wait_for_phase(api_client, namespace, "ttl", "Succeeded", timeout=240, what="the run to succeed")

    ttls = {
        job.metadata.name: (job.metadata.uid in launched_before, job.spec.ttl_seconds_after_finished)
        for job in agent_jobs(api_client, namespace, "ttl")
    }
    assert len(ttls) == 4, ttls
    assert sorted(ttls.values()) == [(False, 1234), (False, 1234), (True, 600), (True, 600)], ttls


def test_max_jobs_per_minute_raised_mid_run_launches_the_waiting_rollouts_together(
    api_client: Any,
    pod_runner: PodRunner,
    namespace: str,
    kubectl: list[str],
    start_operator: OperatorStarter,
) -> None:
    """At 1 Job a minute, the first of a step's four rollouts gets its Job and the others wait (a minute
    each); raised to 100, the other three are created at once, together.

    At once, as docs/crd-reference.md says: a wait begun under the old rate used to be slept out (the
    launcher slept the limiter's delay, which the edit did not cut short), so they came a minute after the
    first. Unedited, the fourth would come three minutes after the first."""
    start_operator()
    manifest = run_manifest("rate", template=AGENT_TEMPLATE, totalSteps=1)
    manifest["spec"]["agents"]["maxJobsPerMinute"] = 1
    apply_ok(kubectl, namespace, manifest)
    (first,) = wait_for(
        lambda: agent_jobs(api_client, namespace, "rate"), timeout=180, what="the first agent Job"
    )
    assert len(agent_jobs(api_client, namespace, "rate")) == 1  # the next is a minute away

    _patch_agents(kubectl, namespace, "rate", maxJobsPerMinute=100)
    _wait_spec_changed(kubectl, namespace, "agents.maxJobsPerMinute")
    jobs = wait_for(
        lambda: _jobs_once(api_client, namespace, "rate", 4),
        timeout=110,
        what="the other three agent Jobs",
    )
    created = sorted(_created(job) for job in jobs)
    assert created[0] == _created(first)
    assert (created[3] - created[1]).total_seconds() <= 10, created
    # Not the minute the old rate asked for: the edit came seconds after the first Job.
    assert (created[1] - created[0]).total_seconds() < 40, created


def test_pool_replicas_edited_mid_run_resizes_the_agent_pool(
    api_client: Any,
    pod_runner: PodRunner,
    namespace: str,
    kubectl: list[str],
    start_operator: OperatorStarter,
    tmp_path: Path,
) -> None:
    """A Pool run of one pod, its agents hanging (the run stays Running), edited to two pods: the pool
    Deployment follows, and its second pod comes up."""
    from kubernetes import client

    start_operator()
    manifest = run_manifest("pool", template=counting_agent_template(tmp_path / "executions"))
    manifest["spec"]["data"]["inline"] = [{"behaviour": "hang"}]
    manifest["spec"]["agents"]["mode"] = "Pool"
    manifest["spec"]["agents"]["pool"] = {"replicas": 1}
    apply_ok(kubectl, namespace, manifest)
    wait_for_phase(api_client, namespace, "pool", "Running", timeout=180, what="the run to be Running")
    apps = client.AppsV1Api(api_client)
    deployment = names.agent_pool_name("pool")

    def replicas(wanted: int) -> bool:
        try:
            found = apps.read_namespaced_deployment(deployment, namespace)
        except client.exceptions.ApiException as error:
            if error.status == 404:
                return False
            raise
        return bool(found.spec.replicas == wanted and (found.status and found.status.replicas) == wanted)

    wait_for(lambda: replicas(1), timeout=120, what="the pool of one pod")
    _patch_agents(kubectl, namespace, "pool", pool={"replicas": 2})
    _wait_spec_changed(kubectl, namespace, "agents.pool.replicas")
    wait_for(lambda: replicas(2), timeout=60, what="the pool resized to two pods")
