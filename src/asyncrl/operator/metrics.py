"""The operator's Prometheus metrics (served by `asyncrl operator --metrics-port`).

Besides its own counters, the operator exports each run's progress as gauges labelled `namespace`/`name`,
set from the status it writes, so one scrape of the operator shows every run: which phase (one series per
phase, 1 for the current one, as kube-state-metrics does), the step, the reward (the last update's and the
best so far), the prompt groups in the window, the oldest carry-over's age, and when the trainer started
and the last step finished (Unix seconds, so an alert can say "no step for N minutes" as `time() - ...`).
A run's series go away when its controller stops (the run was deleted).
"""

from __future__ import annotations

import contextlib
from datetime import datetime

from prometheus_client import CollectorRegistry, Counter, Gauge

from asyncrl.api import AsyncTrainingRunStatus, Phase

RUN_LABELS = ("namespace", "name")


def _unix_seconds(moment: datetime | None) -> float | None:
    return None if moment is None else moment.timestamp()


class OperatorMetrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        self.reconciles = Counter(
            "asyncrl_operator_reconciles",
            "Reconciles of runs by outcome.",
            ["outcome"],
            registry=self.registry,
        )
        self.jobs_created = Counter(
            "asyncrl_operator_agent_jobs_created", "Agent Jobs created.", registry=self.registry
        )
        self.rate_limit_waits = Counter(
            "asyncrl_operator_rate_limit_waits",
            "Times Job creation waited for a limit.",
            ["limit"],
            registry=self.registry,
        )
        self.errors = Counter("asyncrl_operator_errors", "Errors by kind.", ["kind"], registry=self.registry)
        self.missing_permissions = Gauge(
            "asyncrl_operator_missing_permissions",
            "1 for each permission the operator needs and may not use, by namespace (empty: cluster-wide).",
            ["namespace", "permission"],
            registry=self.registry,
        )
        self.api_requests = Counter(
            "asyncrl_operator_api_requests",
            "Kubernetes API requests of the operator's client by verb and resource (kopf's own not counted).",
            ["verb", "resource"],
            registry=self.registry,
        )
        self.leader = Gauge(
            "asyncrl_operator_leader",
            "1 while this replica leads (holds the election's Lease, or runs without election), else 0.",
            registry=self.registry,
        )
        self.status_writes = Counter(
            "asyncrl_operator_status_writes", "Status patches.", registry=self.registry
        )
        self.run_phase = Gauge(
            "asyncrl_run_phase",
            "1 for the run's current phase, 0 for the others.",
            [*RUN_LABELS, "phase"],
            registry=self.registry,
        )
        self.run_step = Gauge(
            "asyncrl_run_step", "The run's last finished training step.", RUN_LABELS, registry=self.registry
        )
        self.run_reward = Gauge(
            "asyncrl_run_reward",
            "Mean reward of the rows the run's last update trained on (status.reward.last).",
            RUN_LABELS,
            registry=self.registry,
        )
        self.run_reward_best = Gauge(
            "asyncrl_run_reward_best",
            "The run's highest update reward so far (status.reward.best).",
            RUN_LABELS,
            registry=self.registry,
        )
        self.run_active_groups = Gauge(
            "asyncrl_run_active_groups",
            "Prompt groups in the run's window now.",
            RUN_LABELS,
            registry=self.registry,
        )
        self.run_carry_over_age_max_steps = Gauge(
            "asyncrl_run_carry_over_age_max_steps",
            "Age in steps of the oldest group carried over at the last step.",
            RUN_LABELS,
            registry=self.registry,
        )
        self.run_start_time = Gauge(
            "asyncrl_run_start_timestamp_seconds",
            "When the run's trainer started (status.startTime), Unix seconds.",
            RUN_LABELS,
            registry=self.registry,
        )
        self.run_last_step_time = Gauge(
            "asyncrl_run_last_step_timestamp_seconds",
            "When the run's last step finished (status.lastStepTime), Unix seconds.",
            RUN_LABELS,
            registry=self.registry,
        )

    def _run_gauges(self) -> tuple[Gauge, ...]:
        return (
            self.run_step,
            self.run_reward,
            self.run_reward_best,
            self.run_active_groups,
            self.run_carry_over_age_max_steps,
            self.run_start_time,
            self.run_last_step_time,
        )

    def observe_run(self, *, namespace: str, name: str, status: AsyncTrainingRunStatus) -> None:
        """The run's gauges from the status the operator computed (a value not known yet is not exported)."""
        for phase in Phase:
            self.run_phase.labels(namespace, name, phase.value).set(1 if status.phase is phase else 0)
        for gauge, value in (
            (self.run_step, status.step),
            (self.run_reward, None if status.reward is None else status.reward.last),
            (self.run_reward_best, None if status.reward is None else status.reward.best),
            (self.run_active_groups, status.active_groups),
            (self.run_carry_over_age_max_steps, status.carry_over_age_max_steps),
            (self.run_start_time, _unix_seconds(status.start_time)),
            (self.run_last_step_time, _unix_seconds(status.last_step_time)),
        ):
            if value is not None:
                gauge.labels(namespace, name).set(value)

    def forget_run(self, *, namespace: str, name: str) -> None:
        """Drop the run's series (its controller stopped: the run was deleted, or the operator stops)."""
        for phase in Phase:
            self._remove(self.run_phase, namespace, name, phase.value)
        for gauge in self._run_gauges():
            self._remove(gauge, namespace, name)

    @staticmethod
    def _remove(gauge: Gauge, *labels: str) -> None:
        with contextlib.suppress(KeyError):  # never set
            gauge.remove(*labels)
