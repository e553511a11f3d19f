"""What the parts of a run's dispatcher share, stated once: the handles they act through (`DispatchIO`),
what they observed and tell each other (`DispatchState`), and the two things each of them does alike: report
a rollout's state to the gateway (`transition`) and say something on the run once in a while (`say_once`).

Each part (`launching.py`, `reports.py`, `cancellations.py`, `agent_pods_io.py`) is handed these two objects
by the dispatcher's facade (`controller.py`) and keeps nothing else in common with the others.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from asyncrl.gateway_api.client import GatewayClient, GatewayError
from asyncrl.operator.dispatcher import agent_pods
from asyncrl.operator.dispatcher.job_state import ReportBook
from asyncrl.operator.kube import JSON, Kube
from asyncrl.operator.metrics import OperatorMetrics
from asyncrl.operator.retry import one_line_reason
from asyncrl.operator.run_link.gateway_link import GatewayLink
from asyncrl.operator.run_link.run_context import RunContext
from asyncrl.rollouts import RolloutState
from asyncrl.workloads import names
from asyncrl.workloads.names import ATTEMPT_ID

logger = logging.getLogger(__name__)

# Transient API errors longer than this fail a rollout's Job creation (`launching.py`); a launch without a Job
# is judged vanished only after it, and a little more (`vanished_launches.py`).
CREATE_JOB_DEADLINE_SECONDS = 120.0
# Every agent Job carries the gateway instance it was launched through: its outcome is meant for that one.
ANNOTATION_GATEWAY_INSTANCE = f"{names.GROUP}/gateway-instance"


@dataclass(frozen=True)
class DispatchIO:
    """The run, and what the dispatcher acts through: the API server, the run's gateway (its client, and the
    link shared with the reconciler that waits out its absence), the metrics, and `changed`, which tells the
    reconciler that something it reads changed."""

    context: RunContext
    kube: Kube
    metrics: OperatorMetrics
    gateway: GatewayClient
    link: GatewayLink
    changed: Callable[[], None]


@dataclass
class DispatchState:
    """What the dispatcher's parts observed and tell each other, and what the reconciler reads of them.

    The agent Jobs: the active ones (by name), and the rollout state last reported to the gateway for each
    (by uid; rebuilt from the watch's listing after a restart). Counts that must survive restarts and TTL
    deletion are not kept here (see `run_link/job_counters.py`)."""

    active: set[str] = field(default_factory=set)
    reported: ReportBook = field(default_factory=ReportBook)
    # Set when a launch may go ahead again: a Job finished, the spec changed (a rate raised, unsuspended).
    capacity: asyncio.Event = field(default_factory=asyncio.Event)
    pool_changed: asyncio.Event = field(default_factory=asyncio.Event)  # agents.mode Pool: resize it
    stopped: bool = False  # the run failed: its agents were stopped and nothing more is launched
    takeover: bool = True  # the next claim takes over leases of a claimer that is gone
    agent_started: bool = False  # an agent pod of this run has run (reported running or done)
    template_error: str | None = None
    fatal_error: str | None = None  # set: the run is Failed with this message
    # Agent pods that cannot start: (the kubelet's reason, one line naming a pod and its image).
    agents_stuck: tuple[str, str] | None = None
    said_at: dict[tuple[str, str], float] = field(default_factory=dict)  # see `say_once`


async def transition(
    io: DispatchIO,
    rollout_id: str,
    state: RolloutState,
    message: str | None,
    *,
    instance_id: str | None = None,
) -> None:
    """Report a rollout's state to the gateway (bound to `instance_id`, the gateway instance its Job was
    launched through, when given): an outcome the gateway refuses is logged, never worth a crash."""
    try:
        await io.link.call(
            lambda: io.gateway.transition(
                rollout_id, state, message=message, attempt_id=ATTEMPT_ID, instance_id=instance_id
            )
        )
    except GatewayError as error:
        # 404: consumed and deleted by the trainer (or gone with a restarted gateway); 409: already
        # terminal (e.g. cancelled), or meant for a gateway instance that restarted since.
        if error.status not in (404, 409):
            logger.warning(
                "run %s rollout %s: the gateway refused %s: %s",
                io.context.name,
                rollout_id,
                state,
                one_line_reason(error),
            )


async def say_once(
    io: DispatchIO,
    state: DispatchState,
    key: tuple[str, str],
    *,
    reason: str,
    message: str,
    warning: bool = True,
) -> None:
    """An event on the run (Warning unless `warning` is False), at most once per `key` per
    WARN_AGAIN_SECONDS: many agents fail alike, and a rate limit is met again and again."""
    now = time.monotonic()
    last = state.said_at.get(key)
    if last is not None and now - last < agent_pods.WARN_AGAIN_SECONDS:
        return
    state.said_at[key] = now
    logger.log(logging.WARNING if warning else logging.INFO, "run %s: %s", io.context.name, message)
    await io.kube.post_event(io.context.run, reason=reason, message=message, warning=warning)


def job_annotations(job: JSON) -> dict[str, str]:
    return dict(job["metadata"].get("annotations") or {})
