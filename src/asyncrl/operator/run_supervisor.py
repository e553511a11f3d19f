"""One run, supervised: its reconciler and its rollout dispatcher side by side, and the gateway link they
share.

The reconciler starts first and alone: it is the one writer of the run's status and phase events and the one
creator of its children, from the first creation on (`reconciliation/reconciler.py`). Once it has prepared
the run (the template read, the children there, the gateway key known), the supervisor opens the run's
gateway link, checks the agent template and starts the dispatcher (`dispatcher/controller.py`), which
launches agent Jobs and reports their outcomes to the gateway and writes no status. A run that failed before
that (a spec only this operator refuses, a child refused for good) starts no dispatcher: the supervisor
returns once the reconcile wrote the failure.

The operator's Job watch delivers the run's Jobs here (`on_job_event`): the trainer's to the reconciler, the
agents' to the dispatcher.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Coroutine, Mapping
from typing import Any

from asyncrl.agent_templates.renderer import TemplateRenderer
from asyncrl.api import AsyncTrainingRunSpec, InvalidRunError, Phase, load_run
from asyncrl.gateway_api.client import GatewayClient
from asyncrl.operator.dispatcher.controller import RunController
from asyncrl.operator.kube import JSON, Kube
from asyncrl.operator.metrics import OperatorMetrics
from asyncrl.operator.reconciliation.child_index import ChildIndex
from asyncrl.operator.reconciliation.reconciler import Reconciler, fail_invalid_run
from asyncrl.operator.run_link.gateway_link import GatewayLink
from asyncrl.operator.run_link.run_context import RunContext
from asyncrl.workloads import children, names

logger = logging.getLogger(__name__)


def parse_run(body: Mapping[str, Any]) -> tuple[JSON, AsyncTrainingRunSpec]:
    """The run as stored, and its spec as this operator reads it (InvalidRunError: a rule only it checks)."""
    run: JSON = {
        "apiVersion": body["apiVersion"],
        "kind": body["kind"],
        "metadata": dict(body["metadata"]),
        "spec": dict(body["spec"]),
        "status": dict(body.get("status") or {}),
    }
    parsed = load_run({key: run[key] for key in ("apiVersion", "kind", "metadata", "spec")})
    return run, parsed.spec


def invalid_reasons(error: InvalidRunError) -> str:
    return "; ".join(str(field_error) for field_error in error.errors)


class RunSupervisor:
    def __init__(
        self,
        run: JSON,
        spec: AsyncTrainingRunSpec,
        *,
        kube: Kube,
        metrics: OperatorMetrics,
        renderer: TemplateRenderer,
        index: ChildIndex | None,
        gateway_address: str,
        agent_start_timeout_seconds: float,
    ) -> None:
        if gateway_address == "localhost":
            gateway_url = f"http://127.0.0.1:{spec.gateway.port}"
        else:
            gateway_url = children.gateway_service_url(run, spec)
        self.context = RunContext(
            run=run,
            spec=spec,
            gateway_url=gateway_url,
            agent_gateway_url=spec.gateway.agent_url or gateway_url,
            gateway_key="",  # read by the reconcile once its Secret exists
            template_source="",  # read by the reconcile
            agent_start_timeout_seconds=agent_start_timeout_seconds,
        )
        self.kube = kube
        self.metrics = metrics
        self.renderer = renderer
        self.reconciler = Reconciler(self.context, kube=kube, metrics=metrics, renderer=renderer, index=index)
        self.dispatcher: RunController | None = None

    # -- entry points -------------------------------------------------------------------------------------

    def on_job_event(self, event_type: str, job: JSON) -> None:
        """The run's Job watch event (or its listing): the trainer's to the reconciler, which never waits for
        the gateway; an agent Job's to the dispatcher (before it starts, its replay at start covers them)."""
        component = (job["metadata"].get("labels") or {}).get(names.LABEL_COMPONENT)
        if component == names.COMPONENT_TRAINER:
            self.reconciler.observe_trainer_job(event_type, job)
        elif self.dispatcher is not None:
            self.dispatcher.on_agent_job_event(event_type, job)

    def update_spec(self, run: JSON, spec: AsyncTrainingRunSpec, template_source: str) -> None:
        """A spec edit the API server admitted: the dispatcher's rate, cap and template, the reconcile's
        suspension."""
        self.context.run = run
        self.context.spec = spec
        self.context.template_source = template_source
        if self.dispatcher is not None:
            self.dispatcher.update_spec(run, spec, template_source)
        self.reconciler.changed()

    async def run(self) -> None:
        """Run until cancelled (the run was deleted, or the operator stops), or until the run failed before
        its dispatcher started."""
        reconciling = asyncio.create_task(
            self.reconciler.reconcile_loop(), name=f"{self.context.name}:reconcile"
        )
        try:
            await self._serve(reconciling)
        finally:
            reconciling.cancel()
            await asyncio.gather(reconciling, return_exceptions=True)
            self.metrics.forget_run(namespace=self.context.namespace, name=self.context.name)

    async def _serve(self, reconciling: asyncio.Task[None]) -> None:
        reconciler = self.reconciler
        prepared = asyncio.create_task(reconciler.prepared.wait())
        ended = asyncio.create_task(reconciler.ended.wait())
        try:
            await asyncio.wait({reconciling, prepared, ended}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            prepared.cancel()
            ended.cancel()
        if reconciling.done():
            reconciling.result()  # surface the failure
        if not reconciler.prepared.is_set():
            return  # failed before it was served: nothing to dispatch
        gateway = GatewayClient(self.context.gateway_url, self.context.gateway_key)
        try:
            await self._dispatch(gateway, reconciling)
        finally:
            await gateway.close()

    async def _dispatch(self, gateway: GatewayClient, reconciling: asyncio.Task[None]) -> None:
        context, reconciler = self.context, self.reconciler
        stored = reconciler.status
        dispatcher: RunController | None = None

        def on_restart() -> None:
            if dispatcher is not None:
                dispatcher.gateway_restarted()

        link = GatewayLink(
            context,
            kube=self.kube,
            client=gateway,
            # The Job counters: never below what the stored status showed, then derived from the gateway.
            shown=reconciler.stored_counts(),
            on_change=reconciler.changed,
            on_restart=on_restart,
        )
        dispatcher = RunController(
            context,
            kube=self.kube,
            metrics=self.metrics,
            renderer=self.renderer,
            gateway=gateway,
            link=link,
            changed=reconciler.changed,
            stored_message=stored.message,
        )
        await dispatcher.check_template()
        self.dispatcher = dispatcher
        reconciler.serve(dispatcher, link, gateway)
        # The Job watch only delivers changes; replay the current agent Jobs of this run so nothing is missed.
        for job in await self.kube.list_agent_jobs(context.namespace, context.name):
            dispatcher.on_agent_job_event("SYNC", job)
        loops: list[Callable[[], Coroutine[Any, Any, None]]] = [*dispatcher.loops(), reconciler.summary_loop]
        tasks = [asyncio.create_task(loop(), name=f"{context.name}:{loop.__name__}") for loop in loops]
        try:
            done, _ = await asyncio.wait([*tasks, reconciling], return_when=asyncio.FIRST_EXCEPTION)
            for task in done:
                task.result()  # surface the failure
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)


async def supervise_run(
    body: Mapping[str, Any],
    *,
    kube: Kube,
    metrics: OperatorMetrics,
    renderer: TemplateRenderer,
    index: ChildIndex | None,
    gateway_address: str,
    agent_start_timeout_seconds: float,
    register: Callable[[RunSupervisor | None], None],
) -> None:
    """Serve one run until cancelled: `register` is told its supervisor (and None when it stops)."""
    try:
        run, spec = parse_run(body)
    except InvalidRunError as error:
        # The API server admitted it, so a rule only this operator checks (the keys spec.trainer.verlOverrides
        # must leave to the run), or an operator/CRD version skew: fail the run and say why, create nothing.
        metrics.errors.labels("invalid_run").inc()
        reference = {key: body[key] for key in ("apiVersion", "kind", "metadata")}
        await fail_invalid_run(
            kube, {**reference, "status": dict(body.get("status") or {})}, invalid_reasons(error)
        )
        return
    if (run.get("status") or {}).get("phase") == Phase.FAILED.value:
        return  # a failed run stays failed; its children are kept for inspection until it is deleted
    supervisor = RunSupervisor(
        run,
        spec,
        kube=kube,
        metrics=metrics,
        renderer=renderer,
        index=index,
        gateway_address=gateway_address,
        agent_start_timeout_seconds=agent_start_timeout_seconds,
    )
    register(supervisor)
    try:
        await supervisor.run()
    finally:
        register(None)
