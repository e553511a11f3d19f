"""The pool runner (`asyncrl agent-pool`, a real process) against a real gateway: a cancelled rollout's agent.

Where the operator deletes a cancelled rollout's Job, a pool pod's runner must notice the cancellation
itself and kill the agent, with everything the agent started, then take the next rollout. Counted, not
assumed: each agent execution appends its rollout, its pid and its child's pid to a file, and the test
checks those processes are gone and that no rollout ran twice.
"""

from __future__ import annotations

import collections
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from asyncrl.gateway_api.tokens import pool_token
from asyncrl.testing.waiting import wait_for
from asyncrl.workloads.pool import POOL_TOKEN_ENV, WORKER_ENV
from tests.gateway.conftest import KEY, RunningGateway, create_rollouts

TEMPLATE = """\
apiVersion: batch/v1
kind: Job
spec:
  template:
    spec:
      containers:
      - name: agent
        image: unused/by-the-runner
        command:
        - {python}
        - -c
        - |
          import os, subprocess, sys, time
          child = None
          if os.environ["BEHAVIOUR"] == "hang":  # a tool process of its own, in the agent's group
              child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
          with open(os.environ["EXECUTIONS"], "a") as log:
              log.write(f"{{os.environ['ROLLOUT']}} {{os.getpid()}} {{child.pid if child else 0}}\\n")
          if child:
              time.sleep(600)
        env:
        - name: EXECUTIONS
          value: "{executions}"
        - name: ROLLOUT
          value: "{{{{ rollout.id }}}}"
        - name: BEHAVIOUR
          value: "{{{{ behaviour }}}}"
"""


def _lines(path: Path) -> list[tuple[str, int, int]]:
    if not path.exists():
        return []
    return [
        (rollout, int(pid), int(child))
        for rollout, pid, child in (line.split() for line in path.read_text().splitlines())
    ]


def _alive(pid: int) -> bool:
    """Running (a zombie no one reaped yet counts as dead: it runs nothing)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rpartition(")")[2].split()[0] != "Z"


@pytest.fixture
def runner(gateway: RunningGateway, tmp_path: Path) -> Iterator[tuple[subprocess.Popen[bytes], Path, Path]]:
    executions = tmp_path / "executions.log"
    template = tmp_path / "agent-job.yaml.j2"
    template.write_text(TEMPLATE.format(python=sys.executable, executions=executions))
    log = tmp_path / "runner.log"
    env = {**os.environ, POOL_TOKEN_ENV: pool_token(KEY), WORKER_ENV: "pod-1", "PYTHONUNBUFFERED": "1"}
    with log.open("wb") as output:
        process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "asyncrl.cli",
                "agent-pool",
                f"--gateway-url={gateway.url}",
                f"--template-file={template}",
                "--run-name=demo",
                "--namespace=ns",
                "--cancel-poll-seconds=0.2",
                "--log-level=info",
            ],
            env=env,
            stdout=output,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        yield process, executions, log
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGTERM)
            try:
                process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()
        for _, pid, child in _lines(executions):  # never leave a stray agent behind, whatever failed
            for leftover in (pid, child):
                if leftover and _alive(leftover):
                    os.kill(leftover, signal.SIGKILL)


def test_a_cancelled_rollout_s_agent_and_its_children_are_killed_and_the_next_rollout_runs(
    gateway: RunningGateway, runner: tuple[subprocess.Popen[bytes], Path, Path]
) -> None:
    process, executions, log = runner
    with gateway.management() as management:
        create_rollouts(management, "slow", group_id="g1", input={"behaviour": "hang"})
        [(_, agent, child)] = wait_for(
            lambda: _lines(executions), timeout=60, what="the hanging agent to start"
        )
        assert management.get("/api/rollouts/slow").json()["state"] == "running"
        assert _alive(agent)
        assert _alive(child)
        cancelled = management.post("/api/rollouts/slow/transition", json={"state": "cancelled"})
        assert cancelled.is_success, cancelled.text
        wait_for(
            lambda: not _alive(agent) and not _alive(child),
            timeout=30,
            what="the cancelled rollout's agent and its child to be killed",
        )
        assert process.poll() is None, "the runner itself must go on"
        create_rollouts(management, "next", group_id="g2", input={"behaviour": "ok"})
        wait_for(
            lambda: management.get("/api/rollouts/next").json()["state"] == "succeeded",
            timeout=60,
            what="the next rollout to run in the same pod",
        )
        slow = management.get("/api/rollouts/slow").json()
        assert slow["state"] == "cancelled", slow  # the runner reported nothing over the cancellation
    ran = collections.Counter(rollout for rollout, _, _ in _lines(executions))
    assert ran == {"slow": 1, "next": 1}
    assert "rollout slow: agent killed: the gateway ended it (cancelled)" in log.read_text()
    assert "HTTP Request" not in log.read_text(), "each poll logged: too noisy for a pod's log"


def test_a_rollout_the_trainer_deleted_while_it_ran_has_its_agent_killed_too(
    gateway: RunningGateway, runner: tuple[subprocess.Popen[bytes], Path, Path]
) -> None:
    process, executions, log = runner
    with gateway.management() as management:
        create_rollouts(management, "slow", group_id="g1", input={"behaviour": "hang"})
        [(_, agent, child)] = wait_for(
            lambda: _lines(executions), timeout=60, what="the hanging agent to start"
        )
        deleted = management.post("/api/rollouts/delete", json={"rollout_ids": ["slow"]})
        assert deleted.json() == {"deleted": 1}, deleted.text
        wait_for(
            lambda: not _alive(agent) and not _alive(child),
            timeout=30,
            what="the deleted rollout's agent and its child to be killed",
        )
        assert process.poll() is None
    wait_for(
        lambda: "rollout slow: agent killed: the gateway no longer knows it" in log.read_text(),
        timeout=30,
        what="the runner to say why it killed the agent",
    )


def test_a_rollout_past_its_timeout_has_its_agent_and_children_killed_and_ends_timed_out(
    gateway: RunningGateway, runner: tuple[subprocess.Popen[bytes], Path, Path]
) -> None:
    process, executions, _ = runner
    with gateway.management() as management:
        create_rollouts(management, "slow", group_id="g1", input={"behaviour": "hang"}, timeout_seconds=2)
        [(_, agent, child)] = wait_for(
            lambda: _lines(executions), timeout=60, what="the hanging agent to start"
        )
        wait_for(
            lambda: not _alive(agent) and not _alive(child),
            timeout=60,
            what="the timed-out rollout's agent and its child to be killed",
        )
        slow = wait_for(
            lambda: (r := management.get("/api/rollouts/slow").json())["state"] != "running" and r,
            timeout=30,
            what="the rollout to end",
        )
        assert slow["state"] == "timed_out", slow
        create_rollouts(management, "next", group_id="g2", input={"behaviour": "ok"})
        wait_for(
            lambda: management.get("/api/rollouts/next").json()["state"] == "succeeded",
            timeout=60,
            what="the next rollout to run in the same pod",
        )
        assert process.poll() is None
    assert collections.Counter(rollout for rollout, _, _ in _lines(executions)) == {"slow": 1, "next": 1}
