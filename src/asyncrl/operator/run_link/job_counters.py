"""The Job counters of a run's status (`jobs.created`, `jobs.failed`), derived from records that survive.

Neither the operator's memory (lost on restart) nor the Jobs themselves (removed by `ttlSecondsAfterFinished`)
can count Jobs: the gateway's launch totals can, since every agent Job starts with a launch recorded there.
They live as long as the gateway instance, so an offset adds what earlier gateway instances counted (as a
counter reset is handled), kept on the run as an annotation that changes only when the gateway restarts:

    created = created_before + totals.launched      failed = failed_before + totals.failed

When the gateway restarts while the operator watches, the counts it showed become the new base. When it
restarted while the operator was down, the status stored last is the base (launches in its last second
before the restart may be missing). Either way the reported counts never go down: they are at least the
stored status. Pure logic; the gateway link (`gateway_link.py`) reads the totals and keeps the annotation,
the reconcile writes the counts in the status.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass

from asyncrl.gateway_api.models import LaunchTotals
from asyncrl.workloads.names import GROUP

logger = logging.getLogger(__name__)

# The value keeps an earlier release's name: runs already carry it, and a new operator must read it.
ANNOTATION_JOB_COUNTER_OFFSET = f"{GROUP}/job-ledger"


@dataclass(frozen=True)
class JobCountsSeen:
    created: int
    failed: int


@dataclass(frozen=True)
class JobCounterOffset:
    """Jobs counted by gateway instances before `gateway_instance` (its own totals come from the gateway)."""

    gateway_instance: str | None = None
    created_before: int = 0
    failed_before: int = 0

    def counts(self, totals: LaunchTotals, *, at_least: JobCountsSeen) -> JobCountsSeen:
        return JobCountsSeen(
            created=max(at_least.created, self.created_before + totals.launched),
            failed=max(at_least.failed, self.failed_before + totals.failed),
        )

    def for_instance(
        self, instance_id: str, totals: LaunchTotals, *, shown: JobCountsSeen
    ) -> JobCounterOffset:
        """The offset to use with gateway `instance_id` (whose totals are `totals`), given the counts shown.

        Same instance: unchanged. A new instance: what was shown is the base, less what the new instance
        already counted (zero unless launches happened through it before we saw it).
        """
        if instance_id == self.gateway_instance:
            return self
        return JobCounterOffset(
            gateway_instance=instance_id,
            created_before=max(0, shown.created - totals.launched),
            failed_before=max(0, shown.failed - totals.failed),
        )

    def to_annotation(self) -> str:
        return json.dumps(
            {
                "gatewayInstance": self.gateway_instance,
                "createdBefore": self.created_before,
                "failedBefore": self.failed_before,
            },
            separators=(",", ":"),
        )

    @classmethod
    def from_annotation(cls, text: str | None) -> JobCounterOffset:
        """The stored offset; an absent or unreadable one is zero (the status is the floor)."""
        if not text:
            return cls()
        try:
            data = json.loads(text)
            return cls(
                gateway_instance=str(data["gatewayInstance"]) if data.get("gatewayInstance") else None,
                created_before=max(0, int(data.get("createdBefore", 0))),
                failed_before=max(0, int(data.get("failedBefore", 0))),
            )
        except (ValueError, TypeError, KeyError, AttributeError) as error:
            logger.warning(
                "ignoring the unreadable %s annotation %r: %s", ANNOTATION_JOB_COUNTER_OFFSET, text, error
            )
            return cls()
