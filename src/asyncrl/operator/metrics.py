"""The operator's Prometheus metrics (served by `asyncrl operator --metrics-port`)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter


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
        self.status_writes = Counter(
            "asyncrl_operator_status_writes", "Status patches.", registry=self.registry
        )
