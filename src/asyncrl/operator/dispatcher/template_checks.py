"""The run's agent template, checked before the first rollout and failed per rollout when it gives no Job.

Before any rollout, the template is rendered for the run's first row (or a placeholder row) and the API
server dry-runs the Job it gives (`check_template`): a template that cannot give a valid agent Job fails the
run now, not each rollout later. A template that fails for one rollout's row fails that rollout
(`template_failed`), with one Warning event per distinct reason.
"""

from __future__ import annotations

import logging
from typing import Any

from asyncrl.agent_templates.render import TemplateError, sample_variables
from asyncrl.agent_templates.renderer import TemplateRenderer, check_template
from asyncrl.gateway_api.models import RolloutView
from asyncrl.operator.dispatcher.shared import DispatchIO, DispatchState, transition
from asyncrl.operator.retry import kube_error_is_transient, one_line_reason
from asyncrl.operator.run_link.run_context import RunContext
from asyncrl.rollouts import RolloutState
from asyncrl.workloads import names
from asyncrl.workloads.agent_jobs import AgentJobSettings, shape_agent_job
from asyncrl.workloads.children import owner_reference
from asyncrl.workloads.names import ATTEMPT_ID

logger = logging.getLogger(__name__)


def agent_job_settings(context: RunContext, timeout_seconds: float | None) -> AgentJobSettings:
    """What every agent Job of the run gets (`timeout_seconds`: the rollout's own, else the run's)."""
    return AgentJobSettings(
        run_name=context.name,
        namespace=context.namespace,
        owner_reference=owner_reference(context.run),
        timeout_seconds=int(timeout_seconds or context.spec.rollout_timeout_seconds),
        ttl_seconds_after_finished=context.spec.agents.ttl_seconds_after_finished,
    )


async def check_agent_template(
    io: DispatchIO, state: DispatchState, renderer: TemplateRenderer, *, stored_message: str | None
) -> None:
    """Render the template for the run's first row (or a placeholder row) before any rollout: a template
    that cannot give a valid agent Job fails the run now (`state.fatal_error`). `stored_message`: the run's
    status message as stored (an event said before an operator restart is not said again)."""
    context = io.context
    rows = context.spec.data.inline
    reason = await check_template(
        renderer,
        context.template_source,
        first_row=rows[0] if rows else None,
        run_name=context.name,
        namespace=context.namespace,
        job_name=names.agent_job_name(context.name, "sample"),
        attempt_id=ATTEMPT_ID,
    )
    # Only for a real row: a placeholder row's `<name>` values may be refused where real ones pass.
    if reason is None and rows:
        reason = await _api_server_refusal(io, renderer, rows[0])
    if reason is None:
        return
    logger.warning("run %s: %s", context.name, reason)
    io.metrics.errors.labels("template").inc()
    if stored_message != reason:  # not again after an operator restart
        await io.kube.post_event(context.run, reason="AgentTemplateError", message=reason, warning=True)
    state.template_error = state.fatal_error = reason


async def _api_server_refusal(io: DispatchIO, renderer: TemplateRenderer, first_row: Any) -> str | None:
    """Why the API server refuses the agent Job the template gives for the run's first row (a dry-run
    create: schema, label syntax, admission); None when it admits it or cannot be asked now.

    A Job every rollout would get refused (a label key that is not DNS-valid: 422 each time) otherwise
    failed every rollout while the run went on consuming steps."""
    context = io.context
    variables = sample_variables(
        first_row,
        run_name=context.name,
        namespace=context.namespace,
        job_name=names.agent_job_name(context.name, "sample"),
        attempt_id=ATTEMPT_ID,
    )
    try:
        rendered = await renderer.render(context.template_source, variables)
    except TemplateError:
        return None  # check_template reports template errors
    job = shape_agent_job(
        rendered,
        settings=agent_job_settings(context, None),
        rollout_id="sample",
        group_id="sample",
        attempt_id=ATTEMPT_ID,
        agent_env={},
    )
    try:
        await io.kube.create_job(job, dry_run=True)
    except Exception as error:
        if kube_error_is_transient(error):
            logger.info("run %s: the agent Job dry run was not answered: %s", context.name, error)
            return None
        return f"the API server rejects the agent Job the template gives: {one_line_reason(error)}"
    return None


async def template_failed(io: DispatchIO, state: DispatchState, rollout: RolloutView, reason: str) -> None:
    """The template gave no Job the API server takes for this rollout: it fails, said once per reason."""
    logger.warning("run %s rollout %s: %s", io.context.name, rollout.rollout_id, reason)
    io.metrics.errors.labels("template").inc()
    if state.template_error != reason:
        await io.kube.post_event(io.context.run, reason="AgentTemplateError", message=reason, warning=True)
    state.template_error = reason
    io.changed()
    await transition(io, rollout.rollout_id, RolloutState.FAILED, f"agent template: {reason}")
