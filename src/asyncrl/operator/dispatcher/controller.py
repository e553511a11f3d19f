"""The rollout dispatcher of one run: queued rollouts become agent Jobs, Job outcomes reach the gateway.

One instance per run, started by the run's supervisor (`run_supervisor.py`) beside the run's reconciler,
once the reconcile has prepared the run; both share the supervisor's link to the run's gateway
(`run_link/gateway_link.py`: calls that wait out its absence, its instance, the Job counters). The dispatcher
tells the reconciler (`changed`) when something it observed changed; the reconciler alone decides the run's
children, its trainer's suspension, stopping, the status and the phase events (`reconcile.py`); the
dispatcher only launches and reports, and writes no status.

This is its facade: it builds the parts, each with one role, over what they share (`shared.py`), and answers
the supervisor and the reconciler (`reconciler.Dispatcher`). Its loops, none polling:
- launching (`launching.py`): long-polls the gateway for queued rollouts and launches one Job each
  (rate-limited, capped, at most once; launches whose Job vanished: `vanished_launches.py`), or keeps a Pool
  run's agent pool (`pool_keeper.py`),
- reports (`reports.py`): applies agent Job watch events to the gateway,
- cancellations (`cancellations.py`): follows the gateway's completion feed and deletes the Jobs of
  cancelled/timed-out rollouts, and the Jobs a restarted gateway left behind,
- agent pods (`agent_pods_io.py`): says which cannot start, and fails their rollouts after the start timeout.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Coroutine
from typing import Any

from asyncrl.agent_templates.renderer import TemplateRenderer
from asyncrl.api import AsyncTrainingRunSpec
from asyncrl.gateway_api.client import GatewayClient
from asyncrl.operator.dispatcher.agent_pods_io import AgentPodWatch
from asyncrl.operator.dispatcher.cancellations import Canceller
from asyncrl.operator.dispatcher.launching import Launcher
from asyncrl.operator.dispatcher.reports import Reporter
from asyncrl.operator.dispatcher.shared import DispatchIO, DispatchState
from asyncrl.operator.dispatcher.template_checks import check_agent_template
from asyncrl.operator.kube import JSON, Kube
from asyncrl.operator.metrics import OperatorMetrics
from asyncrl.operator.run_link.gateway_link import GatewayLink
from asyncrl.operator.run_link.run_context import RunContext

logger = logging.getLogger(__name__)


class RunController:
    def __init__(
        self,
        context: RunContext,
        *,
        kube: Kube,
        metrics: OperatorMetrics,
        renderer: TemplateRenderer,
        gateway: GatewayClient,
        link: GatewayLink,
        changed: Callable[[], None],
        stored_message: str | None = None,
    ) -> None:
        """`link`: the run's gateway link (the supervisor's, shared with the reconciler); `changed`: tells the
        reconciler something it reads changed; `stored_message`: the run's status message as stored (an
        event said before an operator restart is not said again)."""
        self.io = DispatchIO(
            context=context, kube=kube, metrics=metrics, gateway=gateway, link=link, changed=changed
        )
        self.state = DispatchState()
        self.renderer = renderer
        self._stored_message = stored_message
        self.launcher = Launcher(self.io, self.state, renderer=renderer)
        self.reporter = Reporter(self.io, self.state)
        self.canceller = Canceller(self.io, self.state)
        self.agent_pods = AgentPodWatch(self.io, self.state)

    # -- entry points -------------------------------------------------------------------------------------

    def on_agent_job_event(self, event_type: str, job: JSON) -> None:
        """Called on the event loop by the namespace's Job watch, for this run's agent Jobs."""
        self.reporter.on_agent_job_event(event_type, job)

    def update_spec(self, run: JSON, spec: AsyncTrainingRunSpec, template_source: str) -> None:
        """A spec edit the API server admitted (the immutable fields cannot change): the rate and the cap
        apply at once, the template to rollouts not yet launched, suspend through the reconcile."""
        context = self.io.context
        context.run, context.spec, context.template_source = run, spec, template_source
        self.launcher.limiter.per_minute = spec.agents.max_jobs_per_minute
        self.state.capacity.set()
        self.state.pool_changed.set()

    async def check_template(self) -> None:
        """Before any rollout: a template that cannot give a valid agent Job fails the run now."""
        await check_agent_template(self.io, self.state, self.renderer, stored_message=self._stored_message)

    def loops(self) -> list[Callable[[], Coroutine[Any, Any, None]]]:
        """The dispatcher's loops, for its supervisor to run (after `check_template`)."""
        return [
            *([] if self.state.fatal_error else [self.launcher.launch_loop()]),  # an invalid template: none
            self.reporter.report_loop,
            self.canceller.cancellation_loop,
            self.agent_pods.agent_pods_loop,
        ]

    def gateway_restarted(self) -> None:
        """A new gateway instance: the rollouts it held are gone, and so is what we knew of them."""
        self.state.reported.clear()
        self.state.takeover = True

    # -- what the reconciler reads (`reconciler.Dispatcher`) ----------------------------------------------

    @property
    def template_error(self) -> str | None:
        return self.state.template_error

    @property
    def fatal_error(self) -> str | None:
        return self.state.fatal_error

    @property
    def agents_stuck(self) -> tuple[str, str] | None:
        return self.state.agents_stuck

    @property
    def active_jobs(self) -> int:
        return len(self.state.active)

    @property
    def agents_stopped(self) -> bool:
        """The run failed and its agents were stopped (see `stop_agents`)."""
        return self.state.stopped

    async def stop_agents(self) -> None:
        """The run failed (the reconcile decided): launch nothing more and delete the active agent Jobs (a
        Pool run's pods go too). The trainer's suspension is the reconcile's own action."""
        state, context = self.state, self.io.context
        if state.stopped:
            return
        state.stopped = True
        state.capacity.clear()
        state.pool_changed.set()
        for job_name in sorted(state.active):
            with contextlib.suppress(Exception):  # best effort: the run is already marked Failed
                await self.io.kube.delete_job(context.namespace, job_name)
        logger.info("run %s failed: agent Jobs deleted, nothing more launched", context.name)
